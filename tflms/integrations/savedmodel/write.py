"""Writing the output safely: checking OUT_DIR, the hidden sibling directories, saving, checking, committing."""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tflms.errors import SavedModelError, TflmsError
from tflms.integrations.savedmodel.read import (SAVED_MODEL_FILES, SavedModelInfo, _reject_url, _tf,
                                                read_saved_model)

if TYPE_CHECKING:
    from tflms.integrations.savedmodel.rewrite import TraceRewrite

logger = logging.getLogger(__name__)

#: Infixes of the hidden siblings of the output: the model being written, and the old one being replaced.
TEMP_INFIX = ".tflms-tmp-"
OLD_INFIX = ".tflms-old-"


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
            raise SavedModelError(f"OUT_DIR {out_dir} already exists; pass --replace (replace=True) to replace it "
                                  "once the new model is complete, or choose another directory")
        if not out.is_dir():
            raise SavedModelError(f"OUT_DIR {out_dir} exists and is not a directory; remove it or choose another "
                                  "output")
        if any(out.iterdir()) and not any((out / name).is_file() for name in SAVED_MODEL_FILES):
            raise SavedModelError(f"OUT_DIR {out_dir} exists and is not a SavedModel (no {SAVED_MODEL_FILES[0]}); "
                                  "tflms only replaces SavedModel directories: choose another output")
    return out



def _make_sibling(out: Path, infix: str) -> Path:
    """A new empty hidden directory next to ``out`` (same file system, so renames are atomic).

    Unlike ``tempfile.mkdtemp`` (mode 0700) it gets the permissions any new
    directory gets (the umask applies), since it becomes the output.
    """
    for _ in range(100):
        path = out.parent / f".{out.name}{infix}{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
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


def _commit(tmp: Path, out: Path, *, replace: bool) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` is moved aside first and removed only after."""
    if not replace:
        try:
            os.rename(tmp, out)
        except OSError as err:
            raise SavedModelError(f"cannot move the new model into {out} ({err}); did something else create it "
                                  "meanwhile? Nothing was written") from err
        return
    old = _make_sibling(out, OLD_INFIX)
    try:
        os.rename(out, old)  # POSIX: a directory may be renamed over an empty one
    except OSError as err:
        os.rmdir(old)
        raise SavedModelError(f"cannot move the previous model in {out} aside ({err}); nothing was "
                              "changed") from err
    try:
        os.rename(tmp, out)
    except BaseException as err:
        os.rename(old, out)
        if isinstance(err, OSError):
            raise SavedModelError(f"cannot move the new model into {out} ({err}); the previous model was put "
                                  "back") from err
        raise
    shutil.rmtree(old, ignore_errors=True)
    if os.path.lexists(old):
        logger.warning("tflms: the new model is in %s, but the previous one could not be removed from %s", out, old)

