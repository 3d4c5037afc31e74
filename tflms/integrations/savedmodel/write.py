"""Writing the output safely: checking OUT_DIR, the hidden sibling directories, saving, checking, committing."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tflms import atomicfs, interrupts
from tflms.errors import SavedModelError, TflmsError
from tflms.faults import fault_point
from tflms.integrations.savedmodel.read import (SAVED_MODEL_FILES, SavedModelInfo, _reject_url, _tf,
                                                read_saved_model)

if TYPE_CHECKING:
    from tflms.integrations.savedmodel.rewrite import TraceRewrite

logger = logging.getLogger(__name__)

#: Infix of the hidden sibling the new model is written to (after an exchange it holds the replaced model).
TEMP_INFIX = ".tflms-tmp-"
#: Infix of the replaced model's hidden sibling in tflms before atomic exchanges; stale ones are still removed.
OLD_INFIX = ".tflms-old-"
#: The end of every error raised once the work is done but before anything was written.
NOTHING_WRITTEN = "; nothing was written"


def check_output_dir(out_dir: str | os.PathLike, in_dir: Path, *, replace: bool) -> Path:
    """The output as an absolute path, or a :class:`SavedModelError` if writing there is unsafe."""
    _reject_url(str(out_dir), "OUT_DIR")
    out = Path(os.path.abspath(out_dir))
    if out.is_symlink():
        raise SavedModelError(f"OUT_DIR {out_dir} is a symbolic link; give the directory it points to")
    real_out, real_in = out.resolve(), in_dir.resolve()
    if real_out == real_in:
        raise SavedModelError(f"OUT_DIR {out_dir} is IN_DIR: tflms never writes over its input; give another "
                              "output directory")
    if real_in in real_out.parents:
        raise SavedModelError(f"OUT_DIR {out_dir} is inside IN_DIR {in_dir}: tflms never writes into its input; "
                              "give a directory outside it")
    if real_out in real_in.parents:
        raise SavedModelError(f"IN_DIR {in_dir} is inside OUT_DIR {out_dir}: replacing the output would delete "
                              "the input; give another output directory")
    if not out.parent.is_dir():
        raise SavedModelError(f"the parent directory of OUT_DIR {out_dir} does not exist; create "
                              f"{out.parent} first")
    if os.path.lexists(out):
        if not replace:
            raise SavedModelError(f"OUT_DIR {out_dir} already exists; pass replace=True (--replace) to replace it "
                                  "once the new model is complete, or choose another directory")
        _check_replaceable(out, out_dir)
    return out


def _check_replaceable(out: Path, out_dir: str | os.PathLike, now: str = "") -> None:
    """Only a directory holding a SavedModel, or an empty one, is ever replaced."""
    if out.is_symlink() or not out.is_dir():
        raise SavedModelError(f"OUT_DIR {out_dir} {now}exists and is not a directory; remove it or choose another "
                              "output" + (NOTHING_WRITTEN if now else ""))
    if any(out.iterdir()) and not any((out / name).is_file() for name in SAVED_MODEL_FILES):
        raise SavedModelError(f"OUT_DIR {out_dir} {now}exists and is not a SavedModel (no {SAVED_MODEL_FILES[0]}); "
                              "tflms only replaces SavedModel directories: choose another output"
                              + (NOTHING_WRITTEN if now else ""))


def remove_stale_siblings(out: Path) -> list[Path]:
    """Remove the hidden siblings of ``out`` left by tflms processes that are gone (killed); returns them."""
    removed = atomicfs.remove_stale_siblings(out, (TEMP_INFIX, OLD_INFIX))
    for path in removed:
        logger.warning("tflms: removed %s, left behind by a tflms process that was killed", path)
    return removed


def _make_sibling(out: Path, infix: str) -> Path:
    """A new empty hidden directory next to ``out`` (same file system, so renames are atomic).

    Its name records this process (see :func:`tflms.atomicfs.sibling_path`),
    so a later run can remove it if this process is killed. Unlike
    ``tempfile.mkdtemp`` (mode 0700) it gets the permissions any new directory
    gets (the umask applies), since it becomes the output. Creating it is
    also the check that OUT_DIR's parent is writable, done before the work.
    """
    for _ in range(100):
        path = atomicfs.sibling_path(out, infix)
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
        except OSError as err:
            raise SavedModelError(f"cannot write next to OUT_DIR {out}: creating {path.name} in {out.parent} "
                                  f"failed ({err.strerror or err}); make {out.parent} writable or choose an OUT_DIR "
                                  "in a writable directory. Nothing was read or written") from err
    raise SavedModelError(f"cannot create a temporary directory next to {out}")


#: What TensorFlow says when it cannot re-export the gradient functions of a loaded model.
_CUSTOM_GRADIENT_ERROR = "Unable to save gradient functions"
CUSTOM_GRADIENTS_WARNING = (
    "the input's custom gradient functions were not re-exported (TensorFlow cannot save the gradient functions of "
    "a loaded model): gradients taken through the output's functions from outside may fail. The training steps "
    "are not affected: their gradients are part of their graphs")


def _save(loaded, tmp: Path, signatures: Mapping[str, Any]) -> list[str]:
    """Save ``loaded`` into the empty directory ``tmp``; returns warnings."""
    tf = _tf()
    options, warnings = None, []
    for _ in range(2):
        try:
            tf.saved_model.save(loaded, str(tmp), signatures=dict(signatures), options=options)
            return warnings
        except TflmsError:
            raise
        except Exception as err:  # TF raises many types; the caller removes the temporary directory
            if options is None and _CUSTOM_GRADIENT_ERROR in str(err):
                logger.info("tflms: re-saving without custom gradients: %s", err)
                shutil.rmtree(tmp)
                os.mkdir(tmp)
                options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
                warnings.append(CUSTOM_GRADIENTS_WARNING)
                continue
            raise SavedModelError(f"saving the rewritten model failed ({type(err).__name__}: {err}); nothing was "
                                  "written") from err
    raise AssertionError("unreachable")


def _check_written(tmp: Path, info: SavedModelInfo, rewritten: Sequence[TraceRewrite]) -> None:
    """The saved functions hold every swap op; the signatures have the same inputs and outputs."""
    written = read_saved_model(tmp, role="the model just saved in")
    library = {f.signature.name: f for f in written._proto.meta_graphs[0].graph_def.library.function}  # noqa: SLF001
    for t in rewritten:
        try:
            fdef = library.get(written.function(t.function).trace_names[t.trace])
        except (KeyError, IndexError):
            raise SavedModelError(f"the saved model lost the function {t.function!r} ({t.signature}); nothing was "
                                  "written. Please report this") from None
        present = {n.name for n in fdef.node_def} if fdef is not None else set()
        missing = [op for op in t.report.inserted_ops if op not in present]
        if missing:
            raise SavedModelError(f"the saved function {t.function!r} ({t.signature}) lost {len(missing)} swap ops "
                                  f"(e.g. {missing[0]!r}); nothing was written. Please report this")
    before = info._proto.meta_graphs[0].signature_def  # noqa: SLF001
    after = written._proto.meta_graphs[0].signature_def  # noqa: SLF001
    for key in info.signatures:
        old, new = before[key], after[key] if key in after else None
        if new is None or _io_of(old) != _io_of(new):
            raise SavedModelError(f"signature {key!r} changed its inputs or outputs when re-exported; nothing was "
                                  "written. Please report this")


def _io_of(signature_def) -> tuple:
    def side(tensors):
        return tuple(sorted((k, v.dtype, tuple(d.size for d in v.tensor_shape.dim), v.tensor_shape.unknown_rank)
                            for k, v in tensors.items()))
    return side(signature_def.inputs), side(signature_def.outputs), signature_def.method_name


def _commit(tmp: Path, out: Path, *, replace: bool) -> bool:
    """Move the complete model in ``tmp`` to ``out``; returns whether an old model was replaced.

    ``tmp`` is flushed to disk first, so that a power loss after the rename
    cannot leave a renamed but incomplete model. Without ``replace`` the move is a no-clobber rename: anything that appeared
    at ``out`` meanwhile is left alone and the commit is refused. With
    ``replace``, ``out`` is checked again (a SavedModel or empty directory),
    the new model gets its permission modes, and the two are exchanged in one
    atomic step; the old model (now at ``tmp``) is removed after. A signal
    arriving during the commit takes effect once it is complete; the
    :class:`~tflms.interrupts.Interrupted` exception then names the output in
    ``written``.
    """
    atomicfs.fsync_tree(tmp)
    fault_point("before-commit")
    done = False
    try:
        with interrupts.deferred():
            replaced = _commit_now(tmp, out, replace=replace)
            done = True
    except KeyboardInterrupt as err:
        if done:
            err.written = str(out)
        raise
    return replaced


def _commit_now(tmp: Path, out: Path, *, replace: bool) -> bool:
    for _ in range(3):  # OUT_DIR may appear or vanish between the steps; each attempt is safe
        if not replace or not os.path.lexists(out):
            try:
                atomicfs.rename_noreplace(tmp, out)
            except FileExistsError:
                if replace:
                    continue
                raise SavedModelError(f"OUT_DIR {out} was created by something else while tflms was running; it "
                                      "was left as it is. Pass --replace to replace a SavedModel there, or choose "
                                      "another directory" + NOTHING_WRITTEN) from None
            except OSError as err:
                raise SavedModelError(f"cannot move the new model into {out} ({err})" + NOTHING_WRITTEN) from err
            atomicfs.fsync_path(out.parent)
            fault_point("after-commit")
            return False
        _check_replaceable(out, out, now="now ")
        keep_modes(out, tmp)
        try:
            atomicfs.rename_exchange(tmp, out)
        except atomicfs.ExchangeUnsupported as err:
            raise SavedModelError(f"cannot replace OUT_DIR {out} atomically here ({err.strerror}); tflms replaces "
                                  "an output only in one atomic step, so that it is always the old or the new "
                                  "model. Remove it yourself and run again without --replace, or choose another "
                                  "directory" + NOTHING_WRITTEN) from err
        except FileNotFoundError:
            continue  # OUT_DIR was removed meanwhile: write it anew
        except OSError as err:
            raise SavedModelError(f"cannot move the new model into {out} ({err})" + NOTHING_WRITTEN) from err
        atomicfs.fsync_path(out.parent)
        fault_point("after-exchange")
        shutil.rmtree(tmp, ignore_errors=True)  # the old model
        if os.path.lexists(tmp):
            logger.warning("tflms: the new model is in %s, but the previous one could not be removed from %s", out,
                           tmp)
        fault_point("after-commit")
        return True
    raise SavedModelError(f"OUT_DIR {out} keeps changing while tflms writes it (created and removed by something "
                          "else); stop the other writer and run again" + NOTHING_WRITTEN)


def keep_modes(old: Path, new: Path) -> None:
    """Give the tree ``new`` the permission modes of the tree ``old`` it replaces.

    A path in both gets the old mode; a path only in ``new`` loses the
    group/other permissions the old top directory does not grant (a private
    0700 output stays private).
    """
    removed = 0o077 & ~os.stat(old).st_mode
    for dirpath, _, filenames in os.walk(new):
        for path in [Path(dirpath)] + [Path(dirpath) / name for name in filenames]:
            if path.is_symlink():
                continue
            try:
                mode = os.stat(old / path.relative_to(new)).st_mode & 0o7777
            except OSError:
                mode = os.stat(path).st_mode & 0o7777 & ~removed
            os.chmod(path, mode)
