"""docs/semantics.md stays true: its examples run as printed, and the code's
pointers into it name sections that exist.

The examples are the doc's fenced python and sh blocks, run by tests/readme_check.py
(the README's checker) against the build this suite imports attn from; each block
asserts what the text around it states, so a change of behaviour fails here."""
import importlib.util
import os
import re

import pytest

_here = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(_here, "..", ".."))
DOC = os.path.join(REPO, "docs", "semantics.md")
_spec = importlib.util.spec_from_file_location(
    "readme_check", os.path.join(REPO, "tests", "readme_check.py"))
readme_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme_check)

# The build tree the module was imported from (conftest's default: build/python).
BUILD = os.path.dirname(os.path.abspath(
    os.environ.get("ATTN_PYTHONPATH", os.path.join(REPO, "build", "python"))))

# Where code may point into the doc: the sources, the bindings, the tests, the tools.
CODE_FOLDERS = ["include", "src", "python", "tests", "tools", "bench", "fuzz"]
POINTER = re.compile(r'docs/semantics\.md "([^"]+)"')


def _doc_text():
    with open(DOC, encoding="utf-8") as f:
        return f.read()


def _headings():
    return {m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", _doc_text(), re.M)}


def _code_files():
    for folder in CODE_FOLDERS:
        for root, dirs, files in os.walk(os.path.join(REPO, folder)):
            dirs[:] = [d for d in dirs if d != "corpus"]  # fuzz inputs, not code
            for name in files:
                if name.endswith((".cc", ".hpp", ".h", ".py", ".txt", ".sh")):
                    yield os.path.join(root, name)


@pytest.fixture(scope="module")
def results():
    return readme_check.check(DOC, BUILD)


def test_every_example_runs_as_printed(results):
    failed = [f"semantics.md:{r.line}: {r.detail}" for r in results if r.status != "ok"]
    assert not failed, "\n".join(failed)


def test_the_examples_cover_the_contract(results):
    # One python block or more per part of the contract; a lost block is a lost check.
    python = [r for r in results if r.language == "python"]
    assert len(python) >= 15, [r.line for r in python]
    assert any(r.language == "sh" for r in results)  # the CLI's exit statuses and files


def test_code_pointers_name_sections_of_the_doc():
    headings, dangling, found = _headings(), [], 0
    for path in _code_files():
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                for section in POINTER.findall(line):
                    found += 1
                    if section not in headings:
                        dangling.append(f"{os.path.relpath(path, REPO)}:{number}: {section!r}")
    assert found > 0, "no code points into docs/semantics.md"
    assert not dangling, "sections missing from docs/semantics.md:\n" + "\n".join(dangling)


def test_no_code_cites_the_contract_outside_the_repository():
    # The original contract lived outside the tree; code points to docs/semantics.md.
    outside = re.compile(r"\b" + "SP" + r"EC\b")
    cites = []
    for path in _code_files():
        with open(path, encoding="utf-8", errors="replace") as f:
            cites += [f"{os.path.relpath(path, REPO)}:{n}" for n, line in enumerate(f, 1)
                      if outside.search(line)]
    assert not cites, cites


def test_the_readme_points_to_the_doc():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    semantics = readme.split("\n## Semantics\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/semantics.md" in semantics
