"""tests/readme_check.py (ctest `readme`) reports what is broken, where, and skips only by rule."""
import importlib.util
import os

import pytest

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "readme_check", os.path.join(_here, "..", "readme_check.py"))
readme_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_check)

# The build tree the module was imported from (conftest's default: build/python).
BUILD = os.path.dirname(os.path.abspath(
    os.environ.get("ATTN_PYTHONPATH", os.path.join(_here, "..", "..", "build", "python"))))

FENCE = "```"
FAKE_README = f"""# A README with one good and one broken block of each kind

{FENCE}python
import attn
import numpy as np
print(attn.softmax(np.zeros(2)))
{FENCE}

{FENCE}python
undefined_name + 1
{FENCE}

{FENCE}python
>>> 1 + 1
3
{FENCE}

{FENCE}cpp
#include <attn/attn.hpp>

attn::Tensor<float> x({{2, 4}});
auto y = attn::multi_head(x.view(), 2);
{FENCE}

{FENCE}cpp
#include <cstdio>
std::puts("a missing semicolon")
{FENCE}

{FENCE}cpp
return 3;
{FENCE}

{FENCE}c
#include <attn/attn.h>

attn_options options;
attn_options_init(&options);
return options.size == sizeof options ? 0 : 1;
{FENCE}

{FENCE}c
#include <stdbool.h>
bool compiled_as_cpp = nullptr;
{FENCE}

{FENCE}sh
attn pe --n 3 --d 4 --out written.npy   # a comment with CAPITALS [and brackets]
ls written.npy
false
make test
attn pe --n N --d D --out FILE
attn attend x.npy --heads 2 \\
    [--causal]
cat "NOT A PLACEHOLDER.txt"
{FENCE}

{FENCE}
a text block, not run
{FENCE}

{FENCE}ruby
puts 1
{FENCE}
"""


@pytest.fixture(scope="module")
def fake_checkout(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fake")
    (folder / "README.md").write_text(FAKE_README)
    return folder


@pytest.fixture(scope="module")
def results(fake_checkout):
    return {r.line: r for r in readme_check.check(str(fake_checkout / "README.md"), BUILD)}


def line_of(text):
    return FAKE_README.splitlines().index(text) + 1


@pytest.mark.parametrize("first_line,status", [
    ("import attn", "ok"),
    ("undefined_name + 1", "failed"),
    (">>> 1 + 1", "failed"),
    ("#include <attn/attn.hpp>", "ok"),
    ("#include <cstdio>", "failed"),
    ("return 3;", "failed"),
    ("#include <attn/attn.h>", "ok"),
    ("#include <stdbool.h>", "failed"),
    ("attn pe --n 3 --d 4 --out written.npy   # a comment with CAPITALS [and brackets]", "ok"),
    ("ls written.npy", "ok"),
    ("false", "failed"),
    ("make test", "skipped"),
    ("attn pe --n N --d D --out FILE", "skipped"),
    ("attn attend x.npy --heads 2 \\", "skipped"),
    ('cat "NOT A PLACEHOLDER.txt"', "failed"),
    ("puts 1", "failed"),
])
def test_each_block_or_command_has_its_line_and_status(results, first_line, status):
    assert results[line_of(first_line)].status == status, results[line_of(first_line)]


def test_failures_show_the_markdown_line_and_the_output(results):
    assert "NameError: name 'undefined_name'" in results[line_of("undefined_name + 1")].detail
    assert f"line {line_of('undefined_name + 1')}" in results[line_of("undefined_name + 1")].detail
    doctest = results[line_of(">>> 1 + 1")].detail
    assert "Expected:\n    3\nGot:\n    2" in doctest and f"line {line_of('>>> 1 + 1')}" in doctest
    compile_error = results[line_of("#include <cstdio>")].detail
    semicolon = line_of('std::puts("a missing semicolon")')
    assert f"README.md:{semicolon}:" in compile_error
    assert "exit status 3" in results[line_of("return 3;")].detail
    assert "no rule" in results[line_of("puts 1")].detail


def test_skips_say_which_rule(results):
    assert results[line_of("make test")].detail.startswith("make")
    assert "placeholder N" in results[line_of("attn pe --n N --d D --out FILE")].detail
    assert "[...]" in results[line_of("attn attend x.npy --heads 2 \\")].detail


def test_text_blocks_are_not_run_and_the_checkout_is_untouched(results, fake_checkout):
    assert line_of("a text block, not run") not in results
    assert sorted(os.listdir(fake_checkout)) == ["README.md"]  # written.npy went to the copy


def test_the_command_line_exit_status(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{FENCE}sh\ntrue\n{FENCE}\n")
    assert readme_check.main(["readme_check.py", str(readme), BUILD]) == 0
    readme.write_text(f"{FENCE}sh\ntrue\nfalse\n{FENCE}\n")
    assert readme_check.main(["readme_check.py", str(readme), BUILD]) == 1
