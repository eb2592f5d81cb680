"""bench/report.py, the command that regenerates the figures of the README and of
docs/performance.md: its blocks land between their markers and nowhere else, a
missing marker writes nothing, and the whole command runs (--quick) on a copy."""
import importlib.util
import os
import re
import shutil

import pytest

_here = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(_here, "..", ".."))
_spec = importlib.util.spec_from_file_location("report", os.path.join(REPO, "bench", "report.py"))
report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report)

# The build whose `attn` the command runs: the one this suite tests (ctest sets ATTN_CLI).
CLI = os.environ.get("ATTN_CLI", os.path.join(REPO, "build", "bin", "attn"))
BUILD = os.path.dirname(os.path.dirname(os.path.abspath(CLI)))


def fake_checkout(folder, readme_extra=""):
    os.makedirs(folder / "docs")
    (folder / "README.md").write_text(
        "# x\nbefore\n<!-- bench-report:summary -->\nold\n<!-- /bench-report:summary -->\nafter\n"
        + readme_extra, encoding="utf-8")
    (folder / "docs" / "performance.md").write_text(
        "".join(f"<!-- bench-report:{n} -->\nold {n}\n<!-- /bench-report:{n} -->\ntext {n}\n"
                for n in ("summary", "head-dims", "peers", "serving")), encoding="utf-8")


def test_blocks_replace_only_what_lies_between_their_markers(tmp_path):
    fake_checkout(tmp_path)
    report.write(str(tmp_path), {"summary": "S", "head-dims": "H", "peers": "P", "serving": "V"})
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == (
        "# x\nbefore\n<!-- bench-report:summary -->\nS\n<!-- /bench-report:summary -->\nafter\n")
    perf = (tmp_path / "docs" / "performance.md").read_text(encoding="utf-8")
    assert perf == "".join(f"<!-- bench-report:{n} -->\n{b}\n<!-- /bench-report:{n} -->\ntext {n}\n"
                           for n, b in (("summary", "S"), ("head-dims", "H"), ("peers", "P"), ("serving", "V")))


def test_a_missing_or_doubled_marker_writes_no_file(tmp_path):
    fake_checkout(tmp_path, readme_extra="<!-- bench-report:summary -->\n<!-- /bench-report:summary -->\n")
    before = {p: p.read_text(encoding="utf-8") for p in (tmp_path / "README.md", tmp_path / "docs" / "performance.md")}
    with pytest.raises(ValueError, match=r"README\.md: needs exactly one <!-- bench-report:summary -->"):
        report.write(str(tmp_path), {"summary": "S", "head-dims": "H", "peers": "P", "serving": "V"})
    assert {p: p.read_text(encoding="utf-8") for p in before} == before
    assert sorted(os.listdir(tmp_path)) == ["README.md", "docs"]  # no temporary file left


def test_the_checkout_has_each_block_once():
    for relative, names in report.TARGETS.items():
        with open(os.path.join(REPO, relative), encoding="utf-8") as f:
            text = f.read()
        for name in names:
            assert text.count(f"<!-- bench-report:{name} -->") == 1, (relative, name)
            assert text.count(f"<!-- /bench-report:{name} -->") == 1, (relative, name)


def check_rows(block, count, figure):
    """A table of `count` rows below its header, each with a positive figure (regex group 1)."""
    rows = [line for line in block.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == count, rows
    for row in rows:
        figures = [float(x) for x in re.findall(figure, row)]
        assert figures and all(f > 0 for f in figures), row


def test_the_command_measures_and_writes_every_table(tmp_path):
    pytest.importorskip("torch")
    for relative in report.TARGETS:
        os.makedirs(tmp_path / os.path.dirname(relative), exist_ok=True)
        shutil.copy(os.path.join(REPO, relative), tmp_path / relative)
    assert report.main(["--quick", "--write", "--build", BUILD, "--root", str(tmp_path)]) == 0
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    summary = readme.split("<!-- bench-report:summary -->")[1].split("<!-- /bench-report:summary -->")[0]
    check_rows(summary, 19, r"(\d+\.\d+)(?:×| of the)")
    perf = (tmp_path / "docs" / "performance.md").read_text(encoding="utf-8")
    head_dims = perf.split("<!-- bench-report:head-dims -->")[1].split("<!-- /bench-report:head-dims -->")[0]
    assert "| head dim | n = 64 | n = 256 |" in head_dims and re.search(r"\| 16 \| \d\.\d\d \| \d\.\d\d \|", head_dims)
    serving = perf.split("<!-- bench-report:serving -->")[1].split("<!-- /bench-report:serving -->")[0]
    check_rows(serving, 10, r"(?:ratio_to_\w+|speedup_vs_separate|p50|p99) (\d+\.\d+)")
    # Outside the blocks, nothing changed.
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        original = f.read()
    strip = lambda t: re.sub(r"<!-- bench-report:(\S+) -->.*?<!-- /bench-report:\1 -->", "", t, flags=re.S)
    assert strip(readme) == strip(original)


def test_only_the_blocks_named_are_measured_and_written(tmp_path, monkeypatch):
    fake_checkout(tmp_path)

    def not_asked(*args):
        raise AssertionError("a block not named was measured")
    for name in ("summary_rows", "grid", "serving_rows"):
        monkeypatch.setattr(report, name, not_asked)
    monkeypatch.setattr(report, "peer_rows", lambda s: [("a", "p", 1.0, 2.0)])
    assert report.main(["--quick", "--write", "--only", "peers", "--build", BUILD, "--root", str(tmp_path)]) == 0
    perf = (tmp_path / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "| a | p | 1000.0 | 2000.0 | 2.0× |" in perf
    for name in ("summary", "head-dims", "serving"):
        assert f"<!-- bench-report:{name} -->\nold {name}\n" in perf
    assert "old\n" in (tmp_path / "README.md").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        report.main(["--only", "summary,tables", "--root", str(tmp_path)])


def test_the_machine_names_a_generic_cpus_family_and_model(monkeypatch):
    lscpu = "Architecture: x86_64\nCPU family: 25\nModel name: AMD EPYC\nModel: 17\n"
    monkeypatch.setattr(report.subprocess, "run", lambda *a, **k: type("R", (), {"stdout": lscpu})())
    assert report.machine() == f"AMD EPYC (family 25, model 17), {os.cpu_count()} threads"
