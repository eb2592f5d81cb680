#!/usr/bin/python3
"""Run every fenced code block of a Markdown file as printed, so the README stays true.

    readme_check.py README.md BUILD_DIR [ROOT]

`make test` runs it on README.md as the ctest test `readme`, and on each of docs/*.md
(ctest `docs_<name>`, from the repository's root). Each block runs in the file's order
inside one temporary copy of ROOT (default: the folder of the Markdown file), whose
`build` is a link to BUILD_DIR: files a block writes (layer.safetensors, docs/*.png)
land in the copy, never in the checkout, and a later block sees them, as a reader
following the README would. What runs, by the fence's language:

- ```python: a script, under this interpreter with PYTHONPATH=build/python. A block
  whose lines start with `>>> ` is a doctest instead: outputs are compared.
- ```cpp: compiled with the command the build wrote (BUILD_DIR/readme_cxx_command, one
  argument a line: the build's compiler, include/, the library and what it links), then
  run. A block with no `main` is a fragment: its leading #include lines stay at file
  scope and the rest becomes the body of `int main()`.
- ```c: the same with BUILD_DIR/readme_c_command (the C compiler, -std=c99 -pedantic):
  a program of the C API, attn/attn.h.
- ```sh: each command (a line, with its `\\` continuations) on its own, with bash, stdin
  closed (so a line that starts an interpreter just exits) and build/bin first on PATH.
  Not run, by rule: a `make ...` line (it builds and tests the whole project, this check
  included), and a synopsis, i.e. a line with an optional part in brackets
  (`[--causal]`) or an UPPERCASE placeholder word (`IN.npy`, `--n N`) that names no file
  of the repository. Quotes and `# comments` are left out of that test.
- a fence with no language is text (the layout tree) and is not run, nor is a
  ```mermaid diagram (docs/layout.md's rooms: ctest layers_diagram checks it); any other
  language is an error, so that no block goes unchecked.

A failure names the Markdown line and shows the output; the exit status is 1.
"""
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

TIMEOUT_S = 300  # per block or command: a hang is a failure with its line, not a stuck test
FENCE = re.compile(r"^```(\S*)\s*$")


@dataclasses.dataclass
class Block:
    line: int       # line of the first code line in the Markdown file (1-based)
    language: str
    code: str


@dataclasses.dataclass
class Result:
    line: int
    language: str
    status: str     # "ok", "failed" or "skipped"
    detail: str = ""


def fenced_blocks(text):
    blocks, language, start, lines = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        fence = FENCE.match(line)
        if language is None and fence:
            language, start, lines = fence.group(1), number + 1, []
        elif language is not None and line.rstrip() == "```":
            blocks.append(Block(start, language, "\n".join(lines) + "\n"))
            language = None
        elif language is not None:
            lines.append(line)
    if language is not None:
        raise ValueError(f"line {start - 1}: a code fence that is never closed")
    return blocks


def shell_commands(block):
    """(line, command) for each command of an sh block, continuations joined."""
    commands, pending, first = [], "", 0
    for offset, line in enumerate(block.code.splitlines()):
        if not pending:
            first = block.line + offset
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        command, pending = (pending + line).strip(), ""
        if command and not command.startswith("#"):
            commands.append((first, command))
    return commands


def _words_outside_quotes_and_comments(command):
    unquoted = re.sub(r"'[^']*'|\"[^\"]*\"", "''", command)
    return re.sub(r"(^|\s)#.*", "", unquoted)


def skip_reason(command, repo):
    """Why a shell command is not run (None: it runs). See the module docstring."""
    words = _words_outside_quotes_and_comments(command)
    program = [w for w in words.split() if not re.match(r"^\w+=", w)][:1]
    if program == ["make"]:
        return "make: builds and tests the whole project"
    if re.search(r"\[[^\]]*\]", words):
        return "synopsis: optional part in [...]"
    for placeholder in re.findall(r"(?<![\w/.-])[A-Z][A-Z0-9_]*(?:\.\w+)?(?![\w=/-])", words):
        if not os.path.exists(os.path.join(repo, placeholder)):
            return f"synopsis: placeholder {placeholder}"
    return None


def _run(argv, cwd, env, stdin=subprocess.DEVNULL):
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, stdin=stdin, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return f"timed out after {TIMEOUT_S} s\n{e.stdout or ''}"
    if done.returncode == 0:
        return None
    status = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
              else f"exit status {done.returncode}")
    return f"{status}\n{done.stdout}"


def _source_at_line(block, suffix, scratch):
    """The block in a file where it sits at its Markdown line numbers (for tracebacks)."""
    path = os.path.join(scratch, f"readme_line{block.line}{suffix}")
    with open(path, "w") as f:
        f.write("\n" * (block.line - 1) + block.code)
    return path


def run_python(block, repo, env, scratch):
    source = _source_at_line(block, ".txt" if _is_doctest(block) else ".py", scratch)
    argv = [sys.executable] + (["-m", "doctest"] if _is_doctest(block) else []) + [source]
    return _run(argv, repo, env)


def _is_doctest(block):
    return any(line.startswith(">>> ") for line in block.code.splitlines())


def program_text(block, markdown_name):
    """The block as a translation unit; a fragment is wrapped in main (see the docstring)."""
    tag = lambda n: f'#line {block.line + n} "{markdown_name}"\n'  # noqa: E731
    if re.search(r"\bint\s+main\s*\(", block.code):
        return tag(0) + block.code
    lines = block.code.splitlines(keepends=True)
    head = 0
    while head < len(lines) and (not lines[head].strip() or lines[head].startswith("#include")):
        head += 1
    return tag(0) + "".join(lines[:head]) + "int main() {\n" + tag(head) + \
        "".join(lines[head:]) + "}\n"


# The command file the build wrote for each compiled language, and the source suffix.
COMPILED = {"cpp": ("readme_cxx_command", ".cc"), "c": ("readme_c_command", ".c")}


def run_compiled(block, repo, env, scratch, build, markdown_name):
    command_file, suffix = COMPILED[block.language]
    with open(os.path.join(build, command_file)) as f:
        command = f.read().splitlines()
    source = os.path.join(scratch, f"readme_line{block.line}{suffix}")
    program = os.path.join(scratch, f"readme_line{block.line}")
    with open(source, "w") as f:
        f.write(program_text(block, markdown_name))
    failed = _run(command[:1] + [source, "-o", program] + command[1:], scratch, env)
    return f"does not compile: {failed}" if failed else _run([program], repo, env)


def copy_repository(repo, into):
    """The Markdown file's folder without .git and build trees, `build` linking the build."""
    def ignored(folder, names):
        return [n for n in names if n == ".git" or
                os.path.exists(os.path.join(folder, n, "CMakeCache.txt"))]
    copy = os.path.join(into, "repo")
    shutil.copytree(repo, copy, ignore=ignored, symlinks=True)
    if os.path.lexists(os.path.join(copy, "build")):
        os.remove(os.path.join(copy, "build"))
    return copy


def check(markdown, build, root=None):
    """Run every block of `markdown` against the build tree `build`, in a copy of `root`
    (default: the Markdown file's folder); one Result each."""
    markdown, build = os.path.abspath(markdown), os.path.abspath(build)
    with open(markdown, encoding="utf-8") as f:
        blocks = fenced_blocks(f.read())
    name = os.path.basename(markdown)
    results = []
    with tempfile.TemporaryDirectory(prefix="readme_check_") as scratch:
        repo = copy_repository(os.path.abspath(root) if root else os.path.dirname(markdown), scratch)
        os.symlink(build, os.path.join(repo, "build"))
        env = dict(os.environ, PYTHONPATH=os.path.join(repo, "build", "python"),
                   PATH=os.path.join(repo, "build", "bin") + os.pathsep + os.environ["PATH"])
        for block in blocks:
            if block.language in ("", "mermaid"):
                continue
            if block.language == "python":
                results.append(_result(block, run_python(block, repo, env, scratch)))
            elif block.language in COMPILED:
                results.append(_result(block, run_compiled(block, repo, env, scratch, build,
                                                           name)))
            elif block.language == "sh":
                for line, command in shell_commands(block):
                    reason = skip_reason(command, repo)
                    if reason:
                        results.append(Result(line, "sh", "skipped", reason))
                    else:
                        failed = _run(["bash", "-o", "pipefail", "-c", command], repo, env)
                        results.append(Result(line, "sh", "failed" if failed else "ok",
                                              f"$ {command}\n{failed}" if failed else command))
            else:
                results.append(Result(block.line, block.language, "failed",
                                      f"no rule to run a ```{block.language} block"))
    return results


def _result(block, failure):
    return Result(block.line, block.language, "failed" if failure else "ok", failure or "")


def main(argv):
    if len(argv) not in (3, 4):
        print(f"usage: {argv[0]} README.md BUILD_DIR [ROOT]", file=sys.stderr)
        return 2
    results = check(argv[1], argv[2], argv[3] if len(argv) == 4 else None)
    name = os.path.basename(argv[1])
    for r in results:
        first = r.detail.splitlines()[0] if r.detail and r.status != "failed" else ""
        print(f"{name}:{r.line}: {r.language} {r.status}" + (f" ({first})" if first else ""))
        if r.status == "failed":
            print("    " + r.detail.rstrip().replace("\n", "\n    "))
    failed = sum(r.status == "failed" for r in results)
    print(f"{len(results)} blocks/commands: {failed} failed, "
          f"{sum(r.status == 'skipped' for r in results)} skipped by rule")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
