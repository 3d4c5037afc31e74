"""Fault injection on `tflms rewrite`: kills at every phase, concurrent writers, OUT_DIR appearing mid-run; and a
specific message with exit status 2 for every bad input.

The CLI stops at named phases through the test-only ``TFLMS_FAULT`` hook
(tflms/faults.py), so nothing here depends on timing. Every fault test checks:
IN_DIR unchanged (a hash of every file), OUT_DIR absent, the old model or the
complete new one (never partial), nothing of the user's deleted, and no hidden
sibling left after the next run. SIGKILL needs a real process; SIGTERM and
SIGINT are also sent in-process (the CLI handles them), which is faster.
"""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf

from tflms import cli, faults
from tflms.config import LMSConfig
from tflms.errors import UnitsError

#: The slow tier (pytest -m slow): it runs the CLI in subprocesses and kills it at every phase.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: Flags that make the tiny model swap something (so a rewritten model is told from the input by its swap ops).
FLAGS = ("--batch-size", "4", "--min-swap-bytes", "0", "--swapout-threshold", "1")
#: Longest a test waits for a subprocess to reach a phase or to exit (it normally takes seconds).
WAIT_S = 180


class Tiny(tf.Module):
    def __init__(self, seed: int):
        super().__init__()
        self.w1 = tf.Variable(tf.random.stateless_normal((8, 16), seed=(seed, 1)) * 0.3, name="w1")
        self.w2 = tf.Variable(tf.random.stateless_normal((16, 4), seed=(seed, 2)) * 0.3, name="w2")

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32), tf.TensorSpec([None, 4], tf.float32)])
    def train(self, x, y):
        return self.step(x, y)

    def step(self, x, y):
        with tf.GradientTape() as tape:
            h = tf.nn.relu(tf.matmul(x, self.w1))
            h = tf.nn.relu(tf.matmul(h, tf.eye(16) * 0.5))
            loss = tf.reduce_mean(tf.square(tf.matmul(h, self.w2) - y))
        g1, g2 = tape.gradient(loss, [self.w1, self.w2])
        self.w1.assign_sub(0.01 * g1)
        self.w2.assign_sub(0.01 * g2)
        return loss


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    """Two tiny training SavedModels with different weights, saved once."""
    root = tmp_path_factory.mktemp("faults")
    out = {}
    for name, seed in (("a", 1), ("b", 2)):
        tf.saved_model.save(Tiny(seed), str(root / name))
        out[name] = str(root / name)
    return out


def snapshot(root) -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def hidden(parent) -> list[str]:
    return sorted(n for n in os.listdir(parent) if n.startswith("."))


def new_model_of(out, model_dir) -> bool:
    """OUT_DIR holds the complete rewrite of ``model_dir``: it loads, has swap ops and ``model_dir``'s weights."""
    loaded = tf.saved_model.load(str(out))
    (cf,) = loaded.train.concrete_functions
    swaps = [op.name for op in cf.graph.get_operations() if op.name.startswith("lms/")]
    original = tf.saved_model.load(model_dir)
    return bool(swaps) and loaded.w1.numpy().tobytes() == original.w1.numpy().tobytes()


def spawn(*argv, fault: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop(faults.ENV, None)
    if fault:
        env[faults.ENV] = fault
    return subprocess.Popen([sys.executable, "-m", "tflms.cli", *map(str, argv)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_reached(pause: Path, proc: subprocess.Popen) -> None:
    """Wait until ``proc`` pauses at ``pause`` (fails if it exits first)."""
    deadline = time.monotonic() + WAIT_S
    while not Path(f"{pause}.reached").exists():
        if proc.poll() is not None:
            pytest.fail(f"the CLI exited ({proc.returncode}) before the pause: {proc.communicate()[1]}")
        assert time.monotonic() < deadline, "the CLI did not reach the pause"
        time.sleep(0.05)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT_S)
    return proc.returncode, out, err


def messages(stderr: str) -> list[str]:
    """The lines of stderr that are not progress lines ("[tflms] loading ...") or TensorFlow's start-up logs.

    Warnings (e.g. that there is no GPU) may come before the final message.
    """
    return [line for line in stderr.splitlines() if line.strip() and not line.startswith(("[tflms] ", "WARNING: All log",
                                                                                          "I0000 ", "W0000 "))]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def next_run_cleans_up(capsys, models, out) -> None:
    """The next run (--replace: OUT_DIR may hold the model already) succeeds and leaves no hidden sibling."""
    code, _, err = run(capsys, "rewrite", models["a"], out, "--replace", *FLAGS)
    assert code == 0, err
    assert hidden(Path(out).parent) == [], "a hidden sibling survived the next run"
    assert new_model_of(out, models["a"])


# ----------------------------------------------------------------------------------------------- kills

#: (phase, --replace): every state the disk can be in when the process dies: an empty hidden directory
#: (after-load), a complete one (during-save; during-verify and before-commit look the same on disk) beside an
#: old model or none, and the old model hidden after the exchange. SIGTERM and SIGINT: at every phase, below.
KILLS = [("after-load", False), ("during-save", False), ("before-commit", True), ("after-exchange", True)]


@pytest.mark.parametrize("phase,replace", KILLS)
def test_sigkill_at_a_phase_loses_nothing(phase, replace, models, tmp_path, capsys):
    out = tmp_path / "out"
    old = None
    if replace:
        code, _, err = run(capsys, "rewrite", models["b"], out, *FLAGS)
        assert code == 0, err
        old = snapshot(out)
    before = snapshot(models["a"])
    proc = spawn("rewrite", models["a"], out, *FLAGS, *(["--replace"] if replace else []), fault=f"{phase}:sigkill")
    code, _, err = finish(proc)
    assert code == -signal.SIGKILL, err
    assert snapshot(models["a"]) == before, "IN_DIR changed"
    if phase == "after-exchange":  # the new model is in place; the old one waits at the hidden sibling
        assert new_model_of(out, models["a"]) and len(hidden(tmp_path)) == 1
    elif replace:
        assert snapshot(out) == old, "the old model was changed before the commit"
    else:
        assert not out.exists()
    assert hidden(tmp_path), "expected the killed run's hidden directory (else the test proves nothing)"
    next_run_cleans_up(capsys, models, out)


@pytest.mark.parametrize("sig", ["sigterm", "sigint"])
def test_an_outside_signal_stops_the_cli_with_one_line(sig, models, tmp_path, capsys):
    out, pause = tmp_path / "out", tmp_path / "pause"
    before = snapshot(models["a"])
    proc = spawn("rewrite", models["a"], out, *FLAGS, fault=f"during-save:pause={pause}")
    wait_reached(pause, proc)
    assert hidden(tmp_path), "the save should be written to a hidden directory by now"
    proc.send_signal(signal.SIGTERM if sig == "sigterm" else signal.SIGINT)
    code, stdout, err = finish(proc)
    number = signal.SIGTERM if sig == "sigterm" else signal.SIGINT
    assert code == 128 + number, err
    assert messages(err)[-1] == f"tflms: interrupted by {sig.upper()}: stopped; nothing was written"
    assert "Traceback" not in err and stdout == "" and err.count("interrupted") == 1
    assert not out.exists() and hidden(tmp_path) == [] and snapshot(models["a"]) == before


PHASES_IN_PROCESS = [(phase, sig) for phase in faults.PHASES for sig in ("sigterm", "sigint")]


@pytest.mark.parametrize("phase,sig", PHASES_IN_PROCESS)
def test_sigterm_and_sigint_at_every_phase(phase, sig, models, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    replace = phase in ("before-commit", "after-exchange", "after-commit")
    if replace:
        code, _, err = run(capsys, "rewrite", models["b"], out, *FLAGS)
        assert code == 0, err
        old = snapshot(out)
    before = snapshot(models["a"])
    monkeypatch.setenv(faults.ENV, f"{phase}:{sig}")
    code, _, err = run(capsys, "rewrite", models["a"], out, *FLAGS, *(["--verify"] if phase == "during-verify"
                                                                     else []), *(["--replace"] if replace else []))
    monkeypatch.delenv(faults.ENV)
    number = signal.SIGTERM if sig == "sigterm" else signal.SIGINT
    assert code == 128 + number, err
    assert "Traceback" not in err and err.count("interrupted") == 1
    line = messages(err)[-1]
    assert snapshot(models["a"]) == before
    assert hidden(tmp_path) == [], "the interrupted run left a hidden directory"
    if phase in ("after-exchange", "after-commit"):  # the commit is not cut in half: it completes first
        assert line == f"tflms: interrupted by {sig.upper()}: the new output was complete and is in {out}"
        assert new_model_of(out, models["a"])
    else:
        assert line == f"tflms: interrupted by {sig.upper()}: stopped; nothing was written"
        assert (snapshot(out) == old) if replace else not out.exists()


# ----------------------------------------------------------------------------------------------- races

@pytest.mark.parametrize("replace", [False, True])
def test_two_writers_at_once(replace, models, tmp_path, capsys):
    """Writer A (a process) pauses just before its commit while writer B (in-process) writes the same OUT_DIR.

    Without --replace, A then refuses and B's model stays; with --replace, each commit is one whole exchange and
    the last one wins. In both cases no hidden directory remains.
    """
    out, pause = tmp_path / "out", tmp_path / "a"
    flags = [*FLAGS, *(["--replace"] if replace else [])]
    if replace:
        code, _, err = run(capsys, "rewrite", models["b"], out, *FLAGS)  # the previous model
        assert code == 0, err
    proc = spawn("rewrite", models["a"], out, *flags, fault=f"before-commit:pause={pause}")
    wait_reached(pause, proc)
    code, stdout, err = run(capsys, "rewrite", models["b"], out, *flags)
    assert code == 0, err
    assert new_model_of(out, models["b"])
    pause.with_suffix(".go").touch()
    code, stdout, err = finish(proc)
    if replace:
        assert code == 0 and "replacing the previous model" in stdout, err
        assert new_model_of(out, models["a"])
    else:
        assert code == 2, err
        assert f"OUT_DIR {out} was created by something else while tflms was running; it was left as it is" in err
        assert new_model_of(out, models["b"]), "the first model written was replaced"
    assert sorted(os.listdir(tmp_path)) == ["a.go", "a.reached", "out"]


def _while_paused(pause: Path, action) -> threading.Thread:
    """Run ``action`` once the in-process CLI pauses at ``pause``, then let it go on."""
    def body():
        deadline = time.monotonic() + WAIT_S
        while not Path(f"{pause}.reached").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            action()
        finally:
            Path(f"{pause}.go").touch()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("replace", [False, True])
def test_a_directory_created_mid_run_is_never_deleted(replace, models, tmp_path, capsys, monkeypatch):
    out, pause = tmp_path / "work" / "out", tmp_path / "pause"
    out.parent.mkdir()

    def user_creates_out():
        out.mkdir()
        (out / "notes.txt").write_text("precious")

    monkeypatch.setenv(faults.ENV, f"after-load:pause={pause}")
    thread = _while_paused(pause, user_creates_out)
    code, _, err = run(capsys, "rewrite", models["a"], out, *FLAGS, *(["--replace"] if replace else []))
    thread.join()
    assert code == 2, err
    if replace:
        assert f"OUT_DIR {out} now exists and is not a SavedModel" in err and "nothing was written" in err
    else:
        assert f"OUT_DIR {out} was created by something else while tflms was running" in err
    assert (out / "notes.txt").read_text() == "precious" and os.listdir(out) == ["notes.txt"]
    assert os.listdir(out.parent) == ["out"]


def test_replace_keeps_a_private_output_private(models, tmp_path, capsys):
    out = tmp_path / "out"
    code, _, err = run(capsys, "rewrite", models["b"], out, *FLAGS)
    assert code == 0, err
    for dirpath, _, files in os.walk(out):
        os.chmod(dirpath, 0o700)
        for name in files:
            os.chmod(os.path.join(dirpath, name), 0o600)
    (out / "saved_model.pb").chmod(0o400)
    code, _, err = run(capsys, "rewrite", models["a"], out, *FLAGS, "--replace")
    assert code == 0, err
    modes = {str(p.relative_to(out)): stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert modes.pop("saved_model.pb") == 0o400 and modes["."] == 0o700
    loose = {p: oct(m) for p, m in modes.items() if m & 0o077}
    assert not loose, f"group/other permissions appeared: {loose}"


def test_exchange_unsupported_refuses_replace_and_keeps_the_old_model(models, tmp_path, capsys, monkeypatch):
    from tflms import atomicfs
    out = tmp_path / "out"
    code, _, err = run(capsys, "rewrite", models["b"], out, *FLAGS)
    assert code == 0, err
    old = snapshot(out)
    monkeypatch.setattr(atomicfs, "_renameat2_fn", False)
    code, _, err = run(capsys, "rewrite", models["a"], out, *FLAGS, "--replace")
    assert code == 2
    assert f"cannot replace OUT_DIR {out} atomically here" in err and "nothing was written" in err
    assert snapshot(out) == old and hidden(tmp_path) == []


# ----------------------------------------------------------------------------------------------- bad inputs

class Unusual(tf.Module):
    """Training steps --verify cannot run: a RaggedTensor or SparseTensor input, a tf.py_function."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones((8, 4)) * 0.1)

    def _step(self, x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(tf.nn.relu(tf.matmul(x, self.w)) - y))
        self.w.assign_sub(0.01 * tape.gradient(loss, self.w))
        return loss

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.float32), tf.TensorSpec([None, 4])])
    def ragged(self, x, y):
        return self._step(x.to_tensor(shape=[None, 8]), y)

    @tf.function(input_signature=[tf.SparseTensorSpec([None, 8], tf.float32), tf.TensorSpec([None, 4])])
    def sparse(self, x, y):
        return self._step(tf.sparse.to_dense(x), y)

    @tf.function(input_signature=[tf.TensorSpec([None, 8]), tf.TensorSpec([None, 4])])
    def pyfunc(self, x, y):
        x = tf.py_function(lambda t: t, [x], tf.float32)
        x.set_shape([None, 8])
        return self._step(x, y)


@pytest.fixture(scope="session")
def unusual_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("unusual") / "model"
    tf.saved_model.save(Unusual(), str(path))
    return str(path)


@pytest.mark.parametrize("function,message", [
    ("ragged", "its input 'x' is a RaggedTensorSpec"), ("sparse", "its input 'x' is a SparseTensorSpec"),
    ("pyfunc", "it calls Python through tf.py_function or tf.numpy_function")])
def test_verify_refuses_what_it_cannot_run(function, message, unusual_dir, tmp_path, capsys):
    code, _, err = run(capsys, "rewrite", unusual_dir, tmp_path / "out", "--function", function, "--verify",
                       "--batch-size", "4")
    assert code == 2, err
    assert f"--verify cannot run function {function!r}" in err and message in err
    assert "Run without --verify" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("flag", ["--budget", "--min-swap-bytes"])
def test_byte_sizes_too_large_to_count(flag, models, tmp_path, capsys):
    code, _, err = run(capsys, "rewrite", models["a"], tmp_path / "out", flag, "1e400GiB")
    assert code == 2
    assert "'1e400GiB' is too large: at most 9223372036854775807 bytes (8 EiB) can be counted" in err
    with pytest.raises(UnitsError, match="budget: '1e400GiB' is too large"):
        LMSConfig(budget_bytes="1e400GiB")


def test_an_unwritable_parent_is_refused_before_loading(models, tmp_path, capsys, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: make the kernel's answer for a read-only directory explicit
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if Path(path).parent == parent:
                raise PermissionError(13, "Permission denied", str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    try:
        code, _, err = run(capsys, "rewrite", models["a"], parent / "out", *FLAGS)
    finally:
        parent.chmod(0o755)
    assert code == 2
    assert f"cannot write next to OUT_DIR {parent / 'out'}" in err and f"make {parent} writable" in err
    assert "Nothing was read or written" in err and "loading" not in err, "the check must come before the load"
    assert os.listdir(parent) == []


def test_verify_out_of_memory_is_a_clear_error(models, tmp_path, capsys, monkeypatch):
    """What TensorFlow raises for --batch-size 100000000000 (3.2 TB of inputs) after its allocator retried for 10 s;
    raised here at once (the same exception type and message)."""
    from tflms.integrations.savedmodel import verify
    batch = str(10**11)

    def out_of_memory(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, f"OOM when allocating tensor with shape[{batch},8] and "
                                                           "type float on /job:localhost/replica:0/task:0/device:CPU:0")

    monkeypatch.setattr(verify, "example_inputs", out_of_memory)
    code, _, err = run(capsys, "rewrite", models["a"], tmp_path / "out", "--verify", "--batch-size", batch,
                        "--swapout-threshold", "1")  # the rules: the default would tune, and nothing fits 3.2 TB
    assert code == 2, err
    assert "--verify ran out of memory making example inputs for function 'train'" in err
    assert f"with {batch} for every unknown dimension (--batch-size): OOM when allocating" in err
    assert "smaller --batch-size" in err and "Traceback" not in err
    assert os.listdir(tmp_path) == []


def test_calibrate_output_is_checked_first_and_written_atomically(tmp_path, capsys, monkeypatch):
    from tflms.compress import calibrate

    def no_measuring(*args, **kwargs):
        raise AssertionError("the output must be checked before measuring")

    monkeypatch.setattr(calibrate, "calibrate", no_measuring)
    code, _, err = run(capsys, "calibrate", "-o", tmp_path)
    assert code == 2 and f"--output {tmp_path} is a directory; give a file name, e.g. {tmp_path}/codecs.json" in err
    code, _, err = run(capsys, "calibrate", "-o", tmp_path / "missing" / "c.json")
    assert code == 2 and f"create {tmp_path / 'missing'} first" in err
    existing = tmp_path / "c.json"
    existing.write_text("mine")
    existing.chmod(0o600)
    code, _, err = run(capsys, "calibrate", "-o", existing)
    assert code == 2 and "already exists; pass --replace to replace it" in err
    assert existing.read_text() == "mine"
    code, _, err = run(capsys, "calibrate", "--show-defaults", "-o", existing, "--replace")
    assert code == 0, err
    assert '"zvc"' in existing.read_text() and stat.S_IMODE(existing.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["c.json"]


def test_an_empty_saved_model_pb_is_called_truncated_not_tf1(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "saved_model.pb").write_bytes(b"")
    code, _, err = run(capsys, "analyze", tmp_path / "m")
    assert code == 2
    assert "saved_model.pb is empty (0 bytes): the SavedModel is truncated or was not written completely" in err
    assert "TF1" not in err


def test_help_says_verify_runs_the_model(capsys):
    with pytest.raises(SystemExit):
        cli.main(["rewrite", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "This EXECUTES the model's graph, side effects included" in out
    assert "without --verify nothing of the model is run" in out


def test_verify_runs_side_effects_and_rewrite_alone_does_not(tmp_path, capsys):
    """What the help says: only --verify executes the step (here: a tf.io.write_file in it)."""
    marker = tmp_path / "side-effect.txt"

    class Logged(Tiny):
        @tf.function(input_signature=[tf.TensorSpec([None, 8]), tf.TensorSpec([None, 4])])
        def train(self, x, y):
            tf.io.write_file(str(marker), "ran")
            return self.step(x, y)

    tf.saved_model.save(Logged(3), str(tmp_path / "in"))
    for flags in ([], ["--verify"]):
        out = tmp_path / f"out{len(flags)}"
        code, _, err = run(capsys, "rewrite", tmp_path / "in", out, *FLAGS, *flags)
        assert code == 0, err
        assert marker.exists() == bool(flags), f"flags {flags}"
    assert marker.read_text() == "ran"
