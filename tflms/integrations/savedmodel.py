"""Rewrite the training functions of a TF2 SavedModel offline.

:func:`rewrite_saved_model` loads a SavedModel written by
``tf.saved_model.save`` (for example a ``tf.Module`` with a ``train``
``tf.function``), rewrites the traced graphs of the selected functions as
:func:`tflms.tune.tuner.rewrite_for` says, and saves a new SavedModel in which
the same attribute names hold the rewritten functions, running on the restored
variables. ``tf.saved_model.load(out_dir).train(x, y)`` then runs the swapping
graph. :func:`analyze_saved_model` shows the ordering, the swap report and the
simulated memory of each function without writing anything.

What is kept and what changes:

- Each selected ``tf.function`` keeps its name, its input signature (or lack of
  one) and every traced signature: each trace with a training step is rewritten,
  a trace without one (e.g. a ``training=False`` branch) is kept as it is.
  A ``ConcreteFunction`` attribute is replaced by its rewrite.
- Functions that are not selected, variables, assets and sub-objects are kept.
  A signature whose wrapper calls a rewritten trace is re-exported around the
  rewrite (same keys, inputs and outputs); the others are kept as they are.
- Without ``functions``, every function is tried and those with no training step
  (inference functions) are left alone; naming a function without a training
  step is an error.

Data safety: the input directory is never written (an output equal to, inside
or containing the input is refused). The new model is written to a temporary
directory next to the output and renamed into place only once it is complete
and checked (every swap op is in the saved function, the signatures did not
change); on any failure the temporary directory is removed and nothing else is
touched. An existing output is refused unless ``replace=True``, and is then
removed only after the new model took its place; only a SavedModel directory
(or an empty one) is ever replaced. ``verify=True`` additionally loads both
models, runs every rewritten trace once on example inputs and checks that the
outputs and all variables are bitwise identical, before anything is renamed.

Limits: a ``tf.function`` saved without an ``input_signature`` only has the
traces it had when saved (exactly like the loaded original: another input shape
is refused when called, it cannot be retraced). TF1 SavedModels (no object
graph) and remote paths (``gs://``) are refused. ``tf.saved_model.SaveOptions``
of the original save (e.g. function aliases) are not carried over.
"""

from __future__ import annotations

import collections
import dataclasses
import difflib
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tflms.config import LMSConfig
from tflms.errors import GraphError, NoTrainingStepError, SavedModelError, TflmsError
from tflms.rewrite.report import RewriteReport
from tflms.units import format_bytes

logger = logging.getLogger(__name__)

#: Files one of which marks a directory as a SavedModel (binary, text, chunked).
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt", "saved_model.cpb")
#: Infixes of the hidden siblings of the output: the model being written, and the old one being replaced.
TEMP_INFIX = ".tflms-tmp-"
OLD_INFIX = ".tflms-old-"
#: Signature keys that are not user signatures (the init op TF adds to every TF2 SavedModel).
INTERNAL_SIGNATURE_KEYS = frozenset({"__saved_model_init_op"})
#: Size of every unknown dimension of the example inputs of ``verify`` when the config has no ``batch_size``.
VERIFY_UNKNOWN_DIM = 2
#: Seed of the example inputs of ``verify`` (floating point inputs are uniform in [-1, 1)).
VERIFY_SEED = (17, 42)
#: Profile the analysis simulates when the config names none (the tuner's default too).
DEFAULT_PROFILE = "v100-16gb-pcie3"
#: Tensors alive at the peak that an analysis keeps per simulation, largest first.
LIVE_AT_PEAK_KEPT = 50
_CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})


def _tf():
    import tensorflow as tf  # imported lazily: the CLI sets TF's log level first
    return tf


# --------------------------------------------------------------------------------------------------------------
# Reading a SavedModel: which functions it has, under which attribute paths
# --------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class FunctionInfo:
    """A function of a SavedModel's object graph.

    ``path``: shortest attribute path from the root object (``train``,
    ``trainer.step``); ``aliases``: the other paths to the same object (a
    function stored under two attributes is one object). ``kind``:
    ``"function"`` (a ``tf.function``) or ``"concrete"`` (a
    ``ConcreteFunction`` attribute). ``trace_names``: the FunctionDef name of each
    traced signature, in the saved order. ``has_input_signature``: the
    ``tf.function`` was given an ``input_signature``.
    """

    path: str
    kind: str
    trace_names: tuple[str, ...]
    has_input_signature: bool
    aliases: tuple[str, ...] = ()

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.path,) + self.aliases


@dataclasses.dataclass(frozen=True)
class SavedModelInfo:
    """What :func:`read_saved_model` found: the functions and the signatures (key -> called FunctionDef)."""

    path: str
    functions: tuple[FunctionInfo, ...]
    signatures: Mapping[str, tuple[str, ...]]
    _proto: Any = dataclasses.field(repr=False, compare=False, default=None)

    def function(self, path: str) -> FunctionInfo:
        for f in self.functions:
            if path in f.paths:
                return f
        raise KeyError(path)

    def names(self) -> list[str]:
        """Every function's paths, aliases after their function (``alias (= trainer.train)``)."""
        return [f.path + (f" (= {', '.join(f.aliases)})" if f.aliases else "") for f in self.functions]

    def signature_target(self, key: str) -> str | None:
        """The function path a signature's wrapper calls, if it calls exactly one known trace."""
        called = self.signatures.get(key, ())
        for f in self.functions:
            if len(called) == 1 and called[0] in f.trace_names:
                return f.path
        return None


def _reject_url(path: str, role: str) -> None:
    if "://" in str(path):
        raise SavedModelError(f"{role} {path}: remote paths are not supported (the output is written with an "
                              "atomic local rename); copy the SavedModel to a local directory first")


def check_input_dir(in_dir: str | os.PathLike, role: str = "IN_DIR") -> Path:
    """The input directory as an absolute path, or a :class:`SavedModelError` saying what is wrong with it."""
    _reject_url(str(in_dir), role)
    path = Path(in_dir)
    if not path.exists():
        raise SavedModelError(f"{role} {in_dir}: no such directory; give the directory tf.saved_model.save wrote")
    if not path.is_dir():
        hint = (" (a Keras file: load it with keras.models.load_model and save a tf.Module holding the model and "
                "a tf.function training step with tf.saved_model.save)" if path.suffix in (".keras", ".h5") else "")
        raise SavedModelError(f"{role} {in_dir} is a file, not a SavedModel directory{hint}")
    if not any((path / name).is_file() for name in SAVED_MODEL_FILES):
        inner = sorted(str(p.parent) for name in SAVED_MODEL_FILES for p in path.glob(f"*/{name}"))
        hint = f"; did you mean {inner[0]}?" if inner else ""
        raise SavedModelError(f"{role} {in_dir} is not a SavedModel: it has no {SAVED_MODEL_FILES[0]} (write one "
                              f"with tf.saved_model.save(module, dir)){hint}")
    return path.resolve()


def _parse(path: Path):
    from tensorflow.python.saved_model import loader_impl
    try:
        return loader_impl.parse_saved_model(str(path))
    except (OSError, IOError, ValueError) as err:
        raise SavedModelError(f"cannot read the SavedModel in {path}: {err}") from err


def read_saved_model(in_dir: str | os.PathLike, role: str = "IN_DIR") -> SavedModelInfo:
    """List the functions and signatures of the SavedModel in ``in_dir`` (reads the proto only, no variables)."""
    path = check_input_dir(in_dir, role)
    proto = _parse(path)
    meta = proto.meta_graphs[0] if proto.meta_graphs else None
    if meta is None or not meta.HasField("object_graph_def") or not meta.object_graph_def.nodes:
        raise SavedModelError(f"{in_dir} is a TF1 SavedModel (no object graph): tflms rewrites TF2 SavedModels "
                              "written by tf.saved_model.save")
    nodes = meta.object_graph_def.nodes
    paths = _object_paths(nodes)
    functions = []
    for node_id, (node_path, *aliases) in sorted(paths.items(), key=lambda item: item[1][0]):
        node = nodes[node_id]
        kind = node.WhichOneof("kind")
        if kind == "function":
            functions.append(FunctionInfo(node_path, "function", tuple(node.function.concrete_functions),
                                          node.function.function_spec.HasField("input_signature"), tuple(aliases)))
        elif kind == "bare_concrete_function":
            functions.append(FunctionInfo(node_path, "concrete",
                                          (node.bare_concrete_function.concrete_function_name,), True,
                                          tuple(aliases)))
    library = {f.signature.name: f for f in meta.graph_def.library.function}
    signatures = {}
    for key in sorted(meta.signature_def):
        if key in INTERNAL_SIGNATURE_KEYS:
            continue
        signatures[key] = _called_functions(_signature_function_name(nodes, key), library)
    return SavedModelInfo(str(path), tuple(functions), signatures, proto)


def _object_paths(nodes) -> dict[int, list[str]]:
    """Attribute paths of every object: the shortest first (breadth first, children in saved order).

    Further paths are the other attributes holding the object, each under its
    parent's shortest path. The traces under a ``tf.function`` node and the
    signature map are not user attributes and are left out.
    """
    paths: dict[int, list[str]] = {0: [""]}
    queue = collections.deque([0])
    while queue:
        parent = queue.popleft()
        node = nodes[parent]
        if node.WhichOneof("kind") == "function":
            continue
        prefix = paths[parent][0]
        for child in node.children:
            if parent == 0 and child.local_name == "signatures" and _is_signature_map(nodes[child.node_id]):
                continue
            path = f"{prefix}.{child.local_name}" if prefix else child.local_name
            if child.node_id not in paths:
                paths[child.node_id] = [path]
                queue.append(child.node_id)
            elif path not in paths[child.node_id]:
                paths[child.node_id].append(path)
    del paths[0]
    return paths


def _is_signature_map(node) -> bool:
    return node.WhichOneof("kind") == "user_object" and node.user_object.identifier == "signature_map"


def _signature_function_name(nodes, key: str) -> str | None:
    root = nodes[0]
    for child in root.children:
        if child.local_name == "signatures" and _is_signature_map(nodes[child.node_id]):
            for sig in nodes[child.node_id].children:
                if sig.local_name == key:
                    node = nodes[sig.node_id]
                    if node.WhichOneof("kind") == "bare_concrete_function":
                        return node.bare_concrete_function.concrete_function_name
    return None


def _called_functions(name: str | None, library) -> tuple[str, ...]:
    fdef = library.get(name) if name else None
    if fdef is None:
        return ()
    return tuple(n.attr["f"].func.name for n in fdef.node_def if n.op in _CALL_OPS)


def select_functions(info: SavedModelInfo, names: Sequence[str] | None) -> tuple[list[FunctionInfo], bool]:
    """The functions to work on and whether they were named explicitly."""
    if not info.functions:
        raise SavedModelError(f"the SavedModel {info.path} has no functions (no tf.function or ConcreteFunction "
                              "attribute): there is no training step to rewrite")
    if not names:
        return list(info.functions), False
    chosen: dict[str, FunctionInfo] = {}
    for name in names:
        try:
            finfo = info.function(name)
        except KeyError:
            raise SavedModelError(_unknown_function_message(info, name)) from None
        chosen.setdefault(finfo.path, finfo)
    return list(chosen.values()), True


def _unknown_function_message(info: SavedModelInfo, name: str) -> str:
    available = info.names()
    message = f"the SavedModel {info.path} has no function {name!r}; available: {', '.join(available)}"
    if name in info.signatures:
        target = info.signature_target(name)
        return message + (f". {name!r} is a signature key: it calls the function {target!r}; give --function "
                          f"{target} (its signatures are rewritten with it)" if target else
                          f". {name!r} is a signature key, not a function")
    close = difflib.get_close_matches(name, [p for f in info.functions for p in f.paths], n=1)
    return message + (f". Did you mean {close[0]!r}?" if close else "")


# --------------------------------------------------------------------------------------------------------------
# Loading and resolving objects
# --------------------------------------------------------------------------------------------------------------

def _load(path: Path):
    tf = _tf()
    try:
        return tf.saved_model.load(str(path))
    except Exception as err:  # TF raises many types for broken or incompatible models
        raise SavedModelError(f"TensorFlow cannot load the SavedModel in {path}: {type(err).__name__}: {err}. "
                              "Check that it was written by tf.saved_model.save with a compatible TensorFlow and "
                              "that every custom op it uses is registered") from err


def _child(obj: Any, name: str) -> Any:
    try:
        children = obj._trackable_children()  # noqa: SLF001 - the object graph's own names
    except Exception:  # noqa: BLE001 - not every object lists children in every save type
        children = {}
    if name in children:
        return children[name]
    if hasattr(obj, name):
        return getattr(obj, name)
    if isinstance(obj, Sequence) and name.isdigit():
        return obj[int(name)]
    raise SavedModelError(f"the loaded object has no attribute {name!r}")


def _resolve(root: Any, path: str) -> Any:
    obj = root
    try:
        for part in path.split("."):
            obj = _child(obj, part)
    except SavedModelError as err:
        raise SavedModelError(f"cannot find {path!r} on the loaded model: {err}") from err
    return obj


def _set_child(parent: Any, name: str, value: Any, path: str) -> None:
    if isinstance(parent, Sequence) and name.isdigit():
        parent[int(name)] = value  # type: ignore[index]
        return
    try:
        setattr(parent, name, value)
    except (AttributeError, TypeError) as err:
        raise SavedModelError(f"cannot replace the function {path!r} on its loaded parent object "
                              f"({type(parent).__name__}): {err}") from err


def _traces(fn: Any, info: FunctionInfo) -> list:
    if info.kind == "concrete":
        return [fn]
    return list(fn.concrete_functions)


def describe_trace(concrete_function) -> str:
    """``x: float32[?,8], y: float32[?,4]``: a trace's parameters for people."""
    tf = _tf()
    function_type = getattr(concrete_function, "function_type", None)
    if function_type is None:
        return str(concrete_function.structured_input_signature)
    parts = []
    for name, param in function_type.parameters.items():
        spec = param.type_constraint
        if isinstance(spec, tf.TensorSpec):
            dims = "..." if spec.shape.rank is None else ",".join("?" if d is None else str(d)
                                                                   for d in spec.shape.as_list())
            parts.append(f"{name}: {spec.dtype.name}[{dims}]")
        else:
            parts.append(f"{name}: {spec}")
    return ", ".join(parts)


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

    def table(self) -> str:
        lines = [f"tflms rewrite: {self.input_dir} -> {self.output_dir}"]
        for t in self.rewritten:
            lines.append(f"\n{t.function} ({t.signature}): {t.report.num_swapped} tensors swapped "
                         f"({format_bytes(t.report.swapped_bytes)})")
            lines.extend("  " + line for line in t.report.table().splitlines())
            hint = unknown_size_hint(t.report)
            if hint:
                lines.append(f"  hint: {hint}")
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
                "(--batch-size N, or LMSConfig(batch_size=N)) to size them")
    return ""


def _rewritten_function(original, concrete_functions: list):
    """A ``tf.function`` like ``original`` (a restored one) whose traces are ``concrete_functions``.

    Calls dispatch like TensorFlow's restored functions: the first trace that
    accepts the inputs without conversion, else the first that accepts them with.
    """
    from tensorflow.python.saved_model import function_deserialization as fd

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


def _rewrite_trace(cf, config: LMSConfig, progress: Callable[[str], None] | None):
    from tflms.ir import preoptimize, tf_io
    from tflms.tune.tuner import rewrite_for
    step = preoptimize.preoptimize(cf)  # LOAD: grappler first (docs/design.md, "Bitwise under grappler")
    result = rewrite_for(step, config, progress=progress)
    new = tf_io.to_concrete_function(result.graph, step, extra_control_outputs=result.report.inserted_ops)
    return preoptimize.run_preoptimized(new, step), result.report  # BUILD


def _rewrite_functions(loaded, info: SavedModelInfo, selected: list[FunctionInfo], explicit: bool,
                       config: LMSConfig, progress: Callable[[str], None] | None):
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
                    done[id(cf)] = _rewrite_trace(cf, config, progress)
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
            if explicit:
                raise NoTrainingStepError(
                    f"function {finfo.path!r} of {info.path} has no training step in any of its "
                    f"{len(new_traces)} traced signature(s): no gradient ops. It looks like an inference function: "
                    "leave it out of --function (functions not named are kept as they are); tflms rewrites "
                    "training steps (forward + tape.gradient + optimizer update)")
            continue
        replacements[finfo.path] = new_traces[0] if finfo.kind == "concrete" else _rewritten_function(fn, new_traces)
    if not rewritten:
        tried = "; ".join(f"{k.function} ({k.signature}): {k.reason}" for k in skipped)
        raise NoTrainingStepError(
            f"no function of the SavedModel {info.path} has a training step (tried {tried}): tflms rewrites "
            "training steps (forward + tape.gradient + optimizer update) saved as tf.function attributes")
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
        calls = [op.get_attr("f").name for op in wrapper.graph.get_operations() if op.type in _CALL_OPS]
        if len(calls) == 1 and calls[0] in replaced_traces:
            path, new = replaced_traces[calls[0]]
            exported[key] = new
            status[key] = f"rewritten (calls {path})"
        else:
            exported[key] = wrapper
            status[key] = "kept"
    return exported, status


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


def rewrite_saved_model(in_dir: str | os.PathLike, out_dir: str | os.PathLike, config: LMSConfig | None = None, *,
                        functions: Sequence[str] | None = None, replace: bool = False, verify: bool = False,
                        progress: Callable[[str], None] | None = None, **options: Any) -> SavedModelRewrite:
    """Rewrite the training functions of the SavedModel in ``in_dir`` into ``out_dir`` (see module doc).

    ``functions``: attribute paths to rewrite (default: every function with a
    training step). ``options`` override fields of ``config`` (e.g.
    ``budget="12GiB"``, ``batch_size=32``). Raises :class:`SavedModelError`
    for path, selection, write and verification problems, and
    :class:`~tflms.errors.NoTrainingStepError` when there is nothing to rewrite.
    """
    config = LMSConfig.from_kwargs(config, **options)
    functions = [functions] if isinstance(functions, str) else functions
    in_path = check_input_dir(in_dir)
    out_path = check_output_dir(out_dir, in_path, replace=replace)
    info = read_saved_model(in_path)
    selected, explicit = select_functions(info, functions)
    if progress:
        progress(f"loading {in_path}")
    loaded = _load(in_path)
    rewritten, skipped, replaced_traces, replacements = _rewrite_functions(loaded, info, selected, explicit,
                                                                            config, progress)
    _install(loaded, info, replacements)
    signatures, signature_status = _signatures(loaded, replaced_traces)
    existed = os.path.lexists(out_path)
    tmp = _make_sibling(out_path, TEMP_INFIX)
    try:
        if progress:
            progress(f"saving to {tmp}")
        warnings = _save(loaded, tmp, signatures)
        _check_written(tmp, info, rewritten)
        if verify:
            if progress:
                progress("verifying: running every rewritten trace on the input and the output model")
            verify_equivalence(in_path, tmp, rewritten, info, config)
        _commit(tmp, out_path, replace=existed)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for w in warnings:
        logger.warning("tflms: %s", w)
    return SavedModelRewrite(str(in_path), str(out_path), config, tuple(rewritten), tuple(skipped),
                             signature_status, replaced=existed, verified=verify, warnings=tuple(warnings))


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


# --------------------------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------------------------

def example_inputs(concrete_function, batch_size: int | None = None):
    """Deterministic example arguments ``(args, kwargs)`` for a trace's input signature.

    Floating point tensors are uniform in [-1, 1), integers and booleans are
    zeros (valid class labels and indices); an unknown dimension is
    ``batch_size`` (default :data:`VERIFY_UNKNOWN_DIM`).
    """
    tf = _tf()
    dim = batch_size or VERIFY_UNKNOWN_DIM
    counter = iter(range(1 << 30))

    def make(spec):
        if not isinstance(spec, tf.TensorSpec):
            return spec
        if spec.shape.rank is None:
            raise SavedModelError(f"cannot make an example input of unknown rank for {spec}; verify needs ranks")
        shape = [dim if d is None else d for d in spec.shape.as_list()]
        seed = (VERIFY_SEED[0], VERIFY_SEED[1] + next(counter))
        if spec.dtype.is_floating:
            return tf.cast(tf.random.stateless_uniform(shape, seed, minval=-1.0, maxval=1.0), spec.dtype)
        if spec.dtype.is_integer or spec.dtype == tf.bool:
            return tf.zeros(shape, spec.dtype)
        raise SavedModelError(f"cannot make an example input of dtype {spec.dtype.name} ({spec}); run without "
                              "verify and check the model with your own data")

    return tf.nest.map_structure(make, concrete_function.structured_input_signature)


def _variables(root) -> dict[str, Any]:
    """Every variable reachable from ``root``, by its shortest attribute path."""
    tf = _tf()
    found, seen = {}, set()
    queue = collections.deque([("", root)])
    while queue:
        path, obj = queue.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, tf.Variable):
            found[path] = obj
            continue
        try:
            children = obj._trackable_children()  # noqa: SLF001
        except Exception:  # noqa: BLE001 - not a trackable, or one that cannot list children now
            continue
        for name, child in children.items():
            queue.append((f"{path}.{name}" if path else name, child))
    return found


def verify_equivalence(original_dir: str | os.PathLike, rewritten_dir: str | os.PathLike,
                       rewritten: Sequence[TraceRewrite], info: SavedModelInfo, config: LMSConfig) -> None:
    """Run every rewritten trace once in both models; outputs and variables must be bitwise identical.

    Both models are loaded fresh (the variables start from the saved values);
    traces run in order, so later ones start from the state the earlier ones
    left, on both sides alike. Raises :class:`SavedModelError` naming the
    first difference.
    """
    import numpy as np
    tf = _tf()
    before, after = _load(Path(original_dir)), _load(Path(rewritten_dir))
    vars_before, vars_after = _variables(before), _variables(after)
    if sorted(vars_before) != sorted(vars_after):
        raise SavedModelError(f"verification failed: the rewritten model has different variables "
                              f"({sorted(set(vars_before) ^ set(vars_after))[:5]}); nothing was written")
    for t in rewritten:
        finfo = info.function(t.function)
        cf_before = _traces(_resolve(before, t.function), finfo)[t.trace]
        cf_after = _traces(_resolve(after, t.function), finfo)[t.trace]
        args, kwargs = example_inputs(cf_before, config.batch_size)
        out_before = tf.nest.flatten(cf_before(*args, **kwargs))
        out_after = tf.nest.flatten(cf_after(*args, **kwargs))
        where = f"function {t.function!r} ({t.signature})"
        for i, (a, b) in enumerate(zip(out_before, out_after)):
            if np.asarray(a).tobytes() != np.asarray(b).tobytes():
                raise SavedModelError(f"verification failed: {where} output {i} differs; nothing was written")
        for path in sorted(vars_before):
            a, b = vars_before[path].numpy(), vars_after[path].numpy()
            if a.tobytes() != b.tobytes():
                diff = np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0.0
                raise SavedModelError(f"verification failed: after {where}, variable {path!r} differs "
                                      f"(max |diff| {diff:g}); nothing was written")


# --------------------------------------------------------------------------------------------------------------
# Analysis without writing
# --------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TraceAnalysis:
    """Ordering summary, swap report and simulated memory of one trace."""

    function: str
    trace: int
    signature: str
    summary: Mapping[str, Any]
    report: RewriteReport | None
    original_memory: Any  # tflms.sim.SimResult
    rewritten_memory: Any  # tflms.sim.SimResult, or None when nothing was rewritten
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        def memory(sim):
            if sim is None:
                return None
            return {**sim.summary(), "unknown_size_tensors": len(sim.unknown_size_tensors),
                    "live_at_peak": [{"tensor": t, "bytes": b} for t, b in sim.live_at_peak[:LIVE_AT_PEAK_KEPT]],
                    "live_at_peak_count": len(sim.live_at_peak)}
        return {"function": self.function, "trace": self.trace, "signature": self.signature,
                "graph": dict(self.summary), "report": None if self.report is None else self.report.to_dict(),
                "memory": {"original": memory(self.original_memory), "rewritten": memory(self.rewritten_memory)},
                "note": self.note}

    def table(self, top: int = 8) -> str:
        s = self.summary
        cats = ", ".join(f"{k} {v}" for k, v in s["categories"].items())
        lines = [f"{self.function} ({self.signature})",
                 f"  ordering: {s['ops']} ops, {s['levels']} levels; {cats}"]
        if self.report is not None:  # its first line repeats the ordering summary
            lines.extend("  " + line for line in self.report.table().splitlines() if not line.startswith("graph:"))
            hint = unknown_size_hint(self.report)
            if hint:
                lines.append(f"  hint: {hint}")
        if self.note:
            lines.append(f"  note: {self.note}")
        for label, sim in (("original", self.original_memory), ("rewritten", self.rewritten_memory)):
            if sim is None:
                continue
            lines.append(f"  memory ({label}, {sim.profile}): peak {format_bytes(sim.peak_bytes)} = resident "
                         f"{format_bytes(sim.resident_bytes)} + activations {format_bytes(sim.transient_peak_bytes)}"
                         f"; host peak {format_bytes(sim.host_peak_bytes)}; step {sim.step_time_s * 1e3:.3f} ms"
                         + (f"; {len(sim.unknown_size_tensors)} tensors of unknown size counted as 0"
                            if sim.unknown_size_tensors else ""))
            if sim.live_at_peak:
                lines.append(f"    alive at the peak ({len(sim.live_at_peak)} tensors), largest first:")
                lines.extend(f"      {format_bytes(b):>12}  {t}" for t, b in sim.live_at_peak[:top])
        return "\n".join(lines)


def analyze_saved_model(in_dir: str | os.PathLike, config: LMSConfig | None = None, *,
                        functions: Sequence[str] | None = None, **options: Any) -> list[TraceAnalysis]:
    """Analyze the functions of a SavedModel without writing anything (see :class:`TraceAnalysis`).

    Every trace of the selected functions (default: all) gets its ordering
    summary and simulated memory; traces with a training step also get the swap
    report for ``config`` and the simulated memory after the rewrite. The
    simulation uses ``config.profile`` (default :data:`DEFAULT_PROFILE`). A
    budget nothing fits is reported in the trace's ``note``.
    """
    from tflms.analysis.cto import analyze_graph
    from tflms.errors import BudgetError
    from tflms.rewrite.api import load_graph
    from tflms.sim.simulator import SimOptions, simulate
    from tflms.ir import preoptimize
    from tflms.tune.tuner import rewrite_for

    config = LMSConfig.from_kwargs(config, **options)
    functions = [functions] if isinstance(functions, str) else functions
    in_path = check_input_dir(in_dir)
    info = read_saved_model(in_path)
    selected, _ = select_functions(info, functions)
    loaded = _load(in_path)
    profile = config.profile or DEFAULT_PROFILE
    sim_options = SimOptions(host_device=config.host_device)
    out = []
    for finfo in selected:
        for i, cf in enumerate(_traces(_resolve(loaded, finfo.path), finfo)):
            signature = describe_trace(cf)
            try:
                cf = preoptimize.preoptimize(cf)  # the graph `tflms rewrite` rewrites: after grappler
                graph = load_graph(cf, batch_size=config.batch_size)
                analysis = analyze_graph(graph)
            except TflmsError as err:
                raise type(err)(f"function {finfo.path!r} ({signature}) of {info.path}: {err}") from err
            original = simulate(graph, profile, options=sim_options)
            report, rewritten, note = None, None, ""
            if not analysis.has_backward:
                note = "no training step (no gradient ops): nothing to swap; it is kept as is by tflms rewrite"
            else:
                try:
                    result = rewrite_for(cf, config)
                    report = result.report
                    rewritten = simulate(result.graph, profile, options=sim_options)
                except BudgetError as err:
                    note = str(err)
            out.append(TraceAnalysis(finfo.path, i, signature, analysis.summary(), report, original, rewritten, note))
    return out
