"""tflms.atomicfs, tflms.interrupts and tflms.faults: the OS-level pieces of never losing an output."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from tflms import atomicfs, faults, interrupts


def _tree(root, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _read(root) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(params=["renameat2", "fallback"])
def mode(request, monkeypatch):
    """Each test runs with the system's renameat2 and with the fallback used where there is none."""
    if request.param == "renameat2":
        if atomicfs._renameat2() is None:  # noqa: SLF001
            pytest.fail("this Linux C library has no renameat2: the tests expect glibc 2.28+")
    else:
        monkeypatch.setattr(atomicfs, "_renameat2_fn", False)
    return request.param


def test_exchange_swaps_two_directories(tmp_path):
    a = _tree(tmp_path / "a", {"saved_model.pb": "new", "variables/v": "1"})
    b = _tree(tmp_path / "b", {"saved_model.pb": "old", "notes": "x"})
    atomicfs.rename_exchange(a, b)
    assert _read(b) == {"saved_model.pb": "new", "variables/v": "1"}
    assert _read(a) == {"saved_model.pb": "old", "notes": "x"}


def test_exchange_without_renameat2_refuses_and_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(atomicfs, "_renameat2_fn", False)
    a = _tree(tmp_path / "a", {"f": "new"})
    b = _tree(tmp_path / "b", {"f": "old"})
    with pytest.raises(atomicfs.ExchangeUnsupported, match="atomic exchange not supported"):
        atomicfs.rename_exchange(a, b)
    assert _read(a) == {"f": "new"} and _read(b) == {"f": "old"}


def test_exchange_of_a_missing_path_is_file_not_found(tmp_path):
    a = _tree(tmp_path / "a", {"f": "new"})
    with pytest.raises(FileNotFoundError):
        atomicfs.rename_exchange(a, tmp_path / "gone")
    assert _read(a) == {"f": "new"}


@pytest.mark.parametrize("target", ["empty-dir", "full-dir", "file"])
def test_noreplace_refuses_anything_at_the_target(target, tmp_path, mode):
    src = _tree(tmp_path / "src", {"saved_model.pb": "new"})
    dst = tmp_path / "dst"
    if target == "file":
        dst.write_text("precious")
    else:
        dst.mkdir()
        if target == "full-dir":
            (dst / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError):
        atomicfs.rename_noreplace(src, dst)
    assert _read(src) == {"saved_model.pb": "new"}
    if target == "file":
        assert dst.read_text() == "precious"
    else:
        assert _read(dst) == ({"notes.txt": "precious"} if target == "full-dir" else {})


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_noreplace_moves_to_a_free_name(kind, tmp_path, mode):
    src = _tree(tmp_path / "src", {"f": "new"}) if kind == "dir" else tmp_path / "src"
    if kind == "file":
        src.write_text("new")
    atomicfs.rename_noreplace(src, tmp_path / "dst")
    assert not src.exists()
    assert (_read(tmp_path / "dst") == {"f": "new"}) if kind == "dir" else (tmp_path / "dst").read_text() == "new"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sibling_names_record_the_owner_and_only_stale_ones_are_removed(tmp_path):
    out = tmp_path / "out"
    mine = atomicfs.sibling_path(out, ".tflms-tmp-")
    start = atomicfs.process_start_time(os.getpid())
    assert start is not None and mine.name.startswith(f".out.tflms-tmp-{os.getpid()}-{start}-")
    dead = _dead_pid()
    names = {
        "mine": mine.name,
        "dead": f".out.tflms-tmp-{dead}-123-0123abcd",
        "reused": f".out.tflms-old-{os.getpid()}-{start + 1}-0123abcd",  # this pid, another start: a reused pid
        "old-format-dead": f".out.tflms-old-{dead}-89abcdef",
        "other-output": f".outer.tflms-tmp-{dead}-123-0123abcd",
        "user": ".out.tflms-tmp-notes",
    }
    for key, name in names.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "saved_model.pb").write_text(key)
    removed = atomicfs.remove_stale_siblings(out, (".tflms-tmp-", ".tflms-old-"))
    assert sorted(p.name for p in removed) == sorted(names[k] for k in ("dead", "reused", "old-format-dead"))
    assert sorted(os.listdir(tmp_path)) == sorted(names[k] for k in ("mine", "other-output", "user"))


def test_process_alive(tmp_path):
    me = os.getpid()
    assert atomicfs.process_alive(me, atomicfs.process_start_time(me))
    assert atomicfs.process_alive(me, None)
    assert not atomicfs.process_alive(me, atomicfs.process_start_time(me) + 7)
    assert not atomicfs.process_alive(_dead_pid(), None)


def test_write_file_atomic(tmp_path):
    path = tmp_path / "codecs.json"
    atomicfs.write_file_atomic(path, b"one", replace=False)
    assert path.read_bytes() == b"one"
    with pytest.raises(FileExistsError):
        atomicfs.write_file_atomic(path, b"two", replace=False)
    assert path.read_bytes() == b"one"
    os.chmod(path, 0o600)
    stale = tmp_path / f".codecs.json{atomicfs.FILE_TEMP_INFIX}{_dead_pid()}-1-0123abcd"
    stale.write_bytes(b"half")
    atomicfs.write_file_atomic(path, b"two", replace=True)
    assert path.read_bytes() == b"two" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["codecs.json"], "a temporary file was left, or the stale one not removed"


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever an earlier test or library left."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_deferred_delivers_a_signal_when_the_section_ends(python_sigint):
    # The section hands the signal to the handler that was in place (the full suite failed twice when another
    # handler was left installed there).
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.deferred():
            # raise_signal targets this thread; os.kill(getpid()) may land on another thread
            signal.raise_signal(signal.SIGINT)
            for _ in range(100):  # a handled signal runs at the next bytecode boundaries: give it many
                steps.append(1)
            assert interrupts.is_deferring()
    assert len(steps) == 100 and not interrupts.is_deferring()


def test_handled_turns_sigterm_into_interrupted():
    with pytest.raises(interrupts.Interrupted) as caught:
        with interrupts.handled():
            with interrupts.deferred():
                signal.raise_signal(signal.SIGTERM)
                faults.fault_point("after-load")  # unset: nothing happens
    assert caught.value.signum == signal.SIGTERM and caught.value.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_fault_hook_rejects_unknown_phases_and_actions(monkeypatch):
    monkeypatch.setenv(faults.ENV, "after-lunch:sigkill")
    with pytest.raises(ValueError, match="unknown phase 'after-lunch'; phases: after-load"):
        faults.fault_point("after-load")
    monkeypatch.setenv(faults.ENV, "after-load:explode")
    with pytest.raises(ValueError, match="unknown action 'explode'"):
        faults.fault_point("after-load")
    faults.fault_point("after-rewrite")  # a valid phase that is not named: nothing happens
    monkeypatch.setenv(faults.ENV, "after-load:sigterm")
    with pytest.raises(interrupts.Interrupted):
        with interrupts.handled():
            faults.fault_point("after-load")
