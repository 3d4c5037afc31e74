"""Rewriting the training functions of a loaded SavedModel and writing the result (see the package doc)."""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tflms import interrupts
from tflms.config import LMSConfig
from tflms.errors import ConfigError, GraphError, NoTrainingStepError, TflmsError
from tflms.faults import fault_point
from tflms.integrations.savedmodel import verify as _verify
from tflms.integrations.savedmodel.read import (HOW_TO_SAVE, FunctionInfo, SavedModelInfo, _load, _resolve, _set_child,
                                                _traces, check_input_dir, describe_trace, keras_export_message,
                                                read_saved_model, select_functions)
from tflms.integrations.savedmodel.write import (TEMP_INFIX, _check_written, _commit, _make_sibling, _save,
                                                 check_output_dir, remove_stale_siblings)
from tflms.ir.op_types import CALL_OP_TYPES
from tflms.report import RewriteReport
from tflms.units import format_bytes

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------------------
# Rewriting
# --------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TraceRewrite:
    """One rewritten trace: which function, which signature, the report."""

    function: str
    trace: int
    signature: str
    report: RewriteReport

    def to_dict(self) -> dict[str, Any]:
        return {"function": self.function, "trace": self.trace, "signature": self.signature,
                "report": self.report.to_dict()}


@dataclasses.dataclass(frozen=True)
class SkippedTrace:
    """A trace left as it was, and why."""

    function: str
    trace: int
    signature: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SavedModelRewrite:
    """What :func:`rewrite_saved_model` did."""

    input_dir: str
    output_dir: str
    config: LMSConfig
    rewritten: tuple[TraceRewrite, ...]
    skipped: tuple[SkippedTrace, ...]
    signatures: Mapping[str, str]  # key -> "rewritten (calls NAME)" or "kept"
    replaced: bool
    verified: bool
    warnings: tuple[str, ...] = ()

    @property
    def functions(self) -> list[str]:
        """Paths of the rewritten functions, in saved order."""
        return list(dict.fromkeys(t.function for t in self.rewritten))

    def to_dict(self) -> dict[str, Any]:
        return {"input": self.input_dir, "output": self.output_dir, "replaced": self.replaced,
                "verified": self.verified, "config": self.config.to_dict(),
                "functions": {name: [t.to_dict() for t in self.rewritten if t.function == name]
                              for name in self.functions},
                "skipped": [s.to_dict() for s in self.skipped], "signatures": dict(self.signatures),
                "warnings": list(self.warnings)}

    def table(self, *, wide: bool = False) -> str:
        """Readable summary (``wide=True``: every swap row with full names, as ``RewriteReport.table``)."""
        lines = [f"tflms rewrite: {self.input_dir} -> {self.output_dir}"]
        for t in self.rewritten:
            lines.append(f"\n{t.function} ({t.signature}): {t.report.num_swapped} tensors swapped "
                         f"({format_bytes(t.report.swapped_bytes)})")
            lines.extend("  " + line for line in t.report.table(wide=wide).splitlines())
        if self.skipped:
            lines.append("")
            lines.extend(f"kept {s.function} ({s.signature}): {s.reason}" for s in self.skipped)
        if self.signatures:
            lines.append("signatures: " + ", ".join(f"{k} {v}" for k, v in self.signatures.items()))
        if self.verified:
            lines.append("verified: every rewritten trace gives bitwise-identical outputs and variables")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)


def unknown_size_hint(report: RewriteReport) -> str:
    """A hint when tensors were skipped for an unknown size and no batch size was given."""
    unknown = sum(1 for k in report.skipped if k.reason == "unknown-shape")
    if unknown and report.plan.config.batch_size is None:
        return (f"{unknown} tensors have an unknown dimension and were not considered; give a batch size "
                "batch_size=N (--batch-size N) to size them")
    return ""


def _rewritten_function(original, concrete_functions: list):
    """A ``tf.function`` like ``original`` (a restored one) whose traces are ``concrete_functions``.

    Calls dispatch like TensorFlow's restored functions: the first trace that
    accepts the inputs without conversion, else the first that accepts them with.
    """
    from tflms._compat.tf import function_deserialization
    fd = function_deserialization()

    def restored_function_body(*args, **kwargs):
        inputs = (args, kwargs)
        for allow_conversion in (False, True):
            for cf in concrete_functions:
                if fd._concrete_function_callable_with(cf, inputs, allow_conversion):  # noqa: SLF001
                    return fd._call_concrete_function(cf, inputs)  # noqa: SLF001
        raise ValueError(f"no traced signature of this rewritten function accepts these arguments; traced: "
                         f"{[describe_trace(cf) for cf in concrete_functions]}")

    return fd.RestoredFunction(restored_function_body, original._name, original.function_spec,  # noqa: SLF001
                               list(concrete_functions))


def _rewrite_trace(cf, config: LMSConfig, progress: Callable[[str], None] | None, xla: bool = False):
    from tflms.pipeline import rewrite_step
    result = rewrite_step(cf, config, progress=progress, xla=xla)
    return result.function, result.report


def _rewrite_functions(loaded, info: SavedModelInfo, selected: list[FunctionInfo], explicit: bool,
                       config: LMSConfig, progress: Callable[[str], None] | None, xla: bool = False):
    """Rewrite the selected functions' traces; returns rewrites, skips and {old trace name: new trace}."""
    rewritten, skipped, replaced_traces, replacements = [], [], {}, {}
    done: dict[int, tuple[Any, RewriteReport]] = {}  # id(trace) -> rewrite: a trace shared by two functions
    for finfo in selected:
        fn = _resolve(loaded, finfo.path)
        new_traces, any_rewritten = [], False
        for i, cf in enumerate(_traces(fn, finfo)):
            signature = describe_trace(cf)
            if progress:
                progress(f"rewriting {finfo.path} ({signature})")
            try:
                if id(cf) not in done:
                    done[id(cf)] = _rewrite_trace(cf, config, progress, xla)
                new, report = done[id(cf)]
            except GraphError as err:
                # No training step: kept. Unreadable or unsupported: an error when named, else kept.
                no_step = isinstance(err, NoTrainingStepError)
                if explicit and not no_step:
                    raise type(err)(f"function {finfo.path!r} ({signature}) of {info.path}: {err}") from err
                skipped.append(SkippedTrace(finfo.path, i, signature,
                                            "no training step" if no_step else f"not rewritable: {err}"))
                new_traces.append(cf)
                continue
            except TflmsError as err:
                raise type(err)(f"function {finfo.path!r} ({signature}) of {info.path}: {err}") from err
            rewritten.append(TraceRewrite(finfo.path, i, signature, report))
            replaced_traces[_name(cf)] = (finfo.path, new)
            new_traces.append(new)
            any_rewritten = True
        if not any_rewritten:
            if explicit and info.keras_export:
                raise NoTrainingStepError(keras_export_message(info))
            if explicit:
                raise NoTrainingStepError(
                    f"function {finfo.path!r} of {info.path} has no training step in any of its "
                    f"{len(new_traces)} traced signature(s): no gradient ops. It looks like an inference function: "
                    "leave it out of --function (functions not named are kept as they are); tflms rewrites "
                    "training steps (forward + tape.gradient + optimizer update)")
            continue
        replacements[finfo.path] = new_traces[0] if finfo.kind == "concrete" else _rewritten_function(fn, new_traces)
    if not rewritten and info.keras_export:
        raise NoTrainingStepError(keras_export_message(info))
    if not rewritten:
        tried = "; ".join(f"{k.function} ({k.signature}): {k.reason}" for k in skipped)
        raise NoTrainingStepError(
            f"no function of the SavedModel {info.path} has a training step (tried {tried}): tflms rewrites "
            "training steps (forward + tape.gradient + optimizer update) saved as tf.function attributes. "
            + HOW_TO_SAVE)
    return rewritten, skipped, replaced_traces, replacements


def _name(cf) -> str:
    name = cf.name
    return name.decode() if isinstance(name, bytes) else str(name)


def _install(loaded, info: SavedModelInfo, replacements: Mapping[str, Any]) -> None:
    """Put each replacement at every attribute path that held the original (its aliases too)."""
    targets = []
    for path, new in replacements.items():
        for alias in info.function(path).paths:
            parent_path, _, name = alias.rpartition(".")
            targets.append((_resolve(loaded, parent_path) if parent_path else loaded, name, new, alias))
    for parent, name, new, alias in targets:  # resolve everything first: replacing changes the object graph
        _set_child(parent, name, new, alias)


def _signatures(loaded, replaced_traces: Mapping[str, tuple[str, Any]]) -> tuple[dict, dict[str, str]]:
    """The signatures to export and what happened to each."""
    exported, status = {}, {}
    for key in sorted(loaded.signatures.keys()):
        wrapper = loaded.signatures[key]
        calls = [op.get_attr("f").name for op in wrapper.graph.get_operations() if op.type in CALL_OP_TYPES]
        if len(calls) == 1 and calls[0] in replaced_traces:
            path, new = replaced_traces[calls[0]]
            exported[key] = new
            status[key] = f"rewritten (calls {path})"
        else:
            exported[key] = wrapper
            status[key] = "kept"
    return exported, status



def rewrite_saved_model(in_dir: str | os.PathLike, out_dir: str | os.PathLike, config: LMSConfig | None = None, *,
                        functions: Sequence[str] | None = None, replace: bool = False, verify: bool = False,
                        xla: bool = False, progress: Callable[[str], None] | None = None,
                        **options: Any) -> SavedModelRewrite:
    """Rewrite the training functions of the SavedModel in ``in_dir`` into ``out_dir`` (see module doc).

    ``functions``: attribute paths to rewrite (default: every function with a
    training step). ``xla``: keep XLA, in clusters between the copies (issue 47,
    :func:`tflms.pipeline.rewrite_step`); refused with ``verify``, a bitwise check that XLA's fusion does not
    pass. ``options`` override fields of ``config`` (e.g.
    ``budget="12GiB"``, ``batch_size=32``). Raises :class:`SavedModelError`
    for path, selection, write and verification problems, and
    :class:`~tflms.errors.NoTrainingStepError` when there is nothing to rewrite.
    """
    config = LMSConfig.from_kwargs(config, **options)
    if xla and verify:
        raise ConfigError("rewrite --xla --verify: --verify checks that the rewritten functions give the input "
                          "model's outputs and variables bit for bit, and XLA's clusters fuse and round differently "
                          "from TensorFlow's kernels, so no XLA step passes it. Verify without --xla, or rewrite "
                          "with --xla without --verify")
    functions = [functions] if isinstance(functions, str) else functions
    in_path = check_input_dir(in_dir)
    out_path = check_output_dir(out_dir, in_path, replace=replace)
    remove_stale_siblings(out_path)  # left by killed runs; each removal is logged as a warning
    tmp = _make_sibling(out_path, TEMP_INFIX)  # first: OUT_DIR's parent must be writable before any work
    try:
        info = read_saved_model(in_path)
        selected, explicit = select_functions(info, functions)
        if progress:
            progress(f"loading {in_path}")
        loaded = _load(in_path)
        fault_point("after-load")
        rewritten, skipped, replaced_traces, replacements = _rewrite_functions(loaded, info, selected, explicit,
                                                                                config, progress, xla)
        if verify:
            for t in rewritten:
                cf = _traces(_resolve(loaded, t.function), info.function(t.function))[t.trace]
                _verify.check_verifiable(cf, f"function {t.function!r} ({t.signature})")
        fault_point("after-rewrite")
        _install(loaded, info, replacements)
        signatures, signature_status = _signatures(loaded, replaced_traces)
        if progress:
            progress(f"saving to {tmp}")
        warnings = _save(loaded, tmp, signatures)
        fault_point("during-save")
        _check_written(tmp, info, rewritten)
        if verify:
            if progress:
                progress("verifying: running every rewritten trace on the input and the output model")
            _verify.verify_equivalence(in_path, tmp, rewritten, info, config)
        replaced = _commit(tmp, out_path, replace=replace)
    except BaseException:
        with interrupts.deferred():  # a second Ctrl-C must not cut the cleanup short
            shutil.rmtree(tmp, ignore_errors=True)  # after a commit: gone already, or the replaced model
        raise
    for w in warnings:
        logger.warning("tflms: %s", w)
    return SavedModelRewrite(str(in_path), str(out_path), config, tuple(rewritten), tuple(skipped),
                             signature_status, replaced=replaced, verified=verify, warnings=tuple(warnings))

