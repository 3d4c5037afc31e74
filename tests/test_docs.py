"""Every code block in README.md and docs/ runs.

Python blocks of one file run in order, in one fresh interpreter per file, sharing their
names as a reader's session would; a failure names the document's own file and line. A
``<!-- docs-test: setup`` comment whose body is a fenced python block (inside the comment) runs
in its place, before the blocks after it, for what the reader is assumed to have (a model,
data); the reader does not see it. Shell blocks run line by line: ``tflms`` commands run as
written, in a fresh directory, after the file's shell setup (python blocks marked
``<!-- docs-test: shell-setup -->``, visible or hidden, which make the directories they name;
they also run with the file's python blocks); ``pip install`` lines are what CI runs itself
(``.ci/run``) and are not repeated here. A fresh environment's ``python -m venv DIR`` runs, and
``source DIR/bin/activate`` (a shell builtin) checks that the activation script is there. A block can opt out only with
``<!-- docs-test: skip REASON -->`` right before it, and the reason is printed.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*docs-test:\s*(setup|shell-setup|skip)\s*(.*?)\s*(-->)?\s*$")
#: Seconds one file's blocks may take.
TIMEOUT_S = 600


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int
    lang: str
    code: str
    role: str = ""  # "", "setup", "shell-setup" or "skip"
    reason: str = ""


def blocks(path: pathlib.Path) -> list[Block]:
    out, lines, i, pending = [], path.read_text().splitlines(), 0, None
    while i < len(lines):
        mark = MARK.match(lines[i])
        if mark:
            pending = (mark.group(1), mark.group(2))
            i += 1
            continue
        fence = FENCE.match(lines[i])
        if fence and fence.group(1):
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            role, reason = pending or ("", "")
            out.append(Block(path, start, fence.group(1), "\n".join(body) + "\n", role, reason))
            pending = None
        i += 1
    return out


def test_the_block_reader_sees_setups_skips_and_languages(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("text\n<!-- docs-test: setup\n```python\na = 1\n```\n-->\n```python\nprint(a)\n```\n"
                   "<!-- docs-test: skip needs a GPU -->\n```bash\nnvidia-smi\n```\n")
    found = blocks(doc)
    assert [(b.lang, b.role, b.reason) for b in found] == [("python", "setup", ""), ("python", "", ""),
                                                            ("bash", "skip", "needs a GPU")]
    assert found[1].code == "print(a)\n"


def test_every_block_is_python_or_shell_and_every_skip_says_why():
    for path in DOCS:
        for b in blocks(path):
            assert b.lang in ("python", "bash", "sh", "shell", "console", "text"), f"{path.name}:{b.line}: {b.lang}"
            assert b.role != "skip" or b.reason, f"{path.name}:{b.line}: a skip needs a reason"


def test_the_readme_gpu_quickstart_runs_here():
    """Issue 48: the README's GPU quickstart (a fresh environment, the gpu extra, LMS() with no budget) is run by the
    tests below, part by part, not skipped: only its pip install is CI's own step."""
    readme = ROOT / "README.md"
    text = readme.read_text()
    start = text[:text.index("## On a GPU")].count("\n") + 1
    end = start + text.split("## On a GPU", 1)[1].split("\n## ", 1)[0].count("\n")
    shown = [b for b in blocks(readme) if start < b.line <= end and b.role in ("", "setup")]
    assert [(b.lang, b.role) for b in shown] == [("bash", ""), ("python", "setup"), ("python", "")], shown
    assert 'pip install -e ".[gpu]"' in shown[0].code and "tflms.keras.LMS()" in shown[2].code
    assert [c for line, c in _shell_commands(readme) if start < line <= end] == [
        "python -m venv .venv", "source .venv/bin/activate"]


def _skipped(path: pathlib.Path) -> None:
    for b in blocks(path):
        if b.role == "skip":
            print(f"{path.name}:{b.line}: not run: {b.reason}")


def _python_program(path: pathlib.Path) -> str:
    """One program running the file's python blocks in order; tracebacks name the document and its lines."""
    codes = ["\n" * b.line + b.code for b in blocks(path) if b.lang == "python" and b.role != "skip"]
    if not codes:
        return ""
    return (f"scope = {{'__name__': '__main__'}}\nfor code in {codes!r}:\n"
            f"    exec(compile(code, {str(path)!r}, 'exec'), scope)\n")


def _shell_commands(path: pathlib.Path) -> list[tuple[int, str]]:
    commands = []
    for b in blocks(path):
        if b.lang not in ("bash", "sh", "console", "shell") or b.role == "skip":
            continue
        lines = b.code.replace("\\\n", " ").splitlines()  # a trailing backslash continues the line
        for offset, line in enumerate(lines):
            text = line.strip().removeprefix("$ ")
            if not text or text.startswith("#"):
                continue
            parts = [p.strip() for p in text.split("&&")]
            # each part of `a && b` runs on its own, in order; pip install is CI's own first step (.ci/run)
            commands.extend((b.line + offset, p) for p in parts if not p.startswith("pip install"))
    return commands


def _env(*paths: pathlib.Path | None) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT)] + [str(p) for p in paths if p is not None])
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=path, TFLMS_DOCS_TEST="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path, request):
    _skipped(path)
    program = _python_program(path)
    if not program:
        pytest.skip(f"{path.name} has no python blocks")
    script = tmp_path / "doc.py"
    script.write_text(program)
    # a document that trains a tf_keras model gets it as the tf_keras tests do (conftest.py's tf_keras_path)
    tf_keras = request.getfixturevalue("tf_keras_path") if "import tf_keras" in program else None
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(tf_keras), capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (f"{path.name}: a python block failed\n{done.stderr[-4000:]}")


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_shell_blocks_run(path, tmp_path):
    _skipped(path)
    commands = _shell_commands(path)
    if not commands:
        pytest.skip(f"{path.name} has no shell blocks")
    setup = [b.code for b in blocks(path) if b.role == "shell-setup" and b.lang == "python"]
    if setup:
        script = tmp_path / "setup.py"
        script.write_text("\n".join(setup))
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        assert done.returncode == 0, f"{path.name}: the shell setup failed\n{done.stderr[-3000:]}"
    for line, command in commands:
        argv = shlex.split(command, comments=True)  # a trailing "# ..." is a comment, as in a shell
        if argv[0] in ("source", "."):  # activating the environment the line before made: it must be there
            assert (tmp_path / argv[1]).is_file(), f"{path.name}:{line}: `{command}`: no {argv[1]}"
            continue
        if argv[0] == "tflms":
            argv = [sys.executable, "-m", "tflms.cli", *argv[1:]]
        elif argv[0] == "python":
            argv = [sys.executable, *argv[1:]]
        in_repo = len(argv) > 1 and argv[1].startswith(("tools/", "examples/"))  # scripts of the repository
        done = subprocess.run(argv, cwd=ROOT if in_repo else tmp_path, env=_env(),
                              capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, f"{path.name}:{line}: `{command}` exited {done.returncode}\n{done.stderr[-3000:]}"
