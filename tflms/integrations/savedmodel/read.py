"""Reading a SavedModel: which functions it has, under which attribute paths; loading and resolving objects."""

from __future__ import annotations

import collections
import dataclasses
import difflib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tflms.errors import SavedModelError
from tflms._compat.tf import trackable_children
from tflms.ir.op_types import CALL_OP_TYPES

logger = logging.getLogger(__name__)

#: Files one of which marks a directory as a SavedModel (binary, text, chunked).
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt", "saved_model.cpb")
#: Signature keys that are not user signatures (the init op TF adds to every TF2 SavedModel).
INTERNAL_SIGNATURE_KEYS = frozenset({"__saved_model_init_op"})


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
    #: written by Keras's ``model.export()`` (its ExportArchive): inference endpoints, no training step
    keras_export: bool = False

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
    from tflms._compat.tf import parse_saved_model
    try:
        return parse_saved_model(str(path))
    except (OSError, IOError, ValueError) as err:
        raise SavedModelError(f"cannot read the SavedModel in {path}: {err}") from err


def read_saved_model(in_dir: str | os.PathLike, role: str = "IN_DIR") -> SavedModelInfo:
    """List the functions and signatures of the SavedModel in ``in_dir`` (reads the proto only, no variables)."""
    path = check_input_dir(in_dir, role)
    proto = _parse(path)
    if not proto.meta_graphs:
        files = [name for name in SAVED_MODEL_FILES if (path / name).is_file()]
        size = (path / files[0]).stat().st_size if files else 0
        state = "is empty (0 bytes)" if size == 0 else f"holds no MetaGraph ({size} bytes)"
        raise SavedModelError(f"{in_dir}: {files[0] if files else SAVED_MODEL_FILES[0]} {state}: the SavedModel is "
                              "truncated or was not written completely (a save that was interrupted or a full "
                              "disk?); write it again with tf.saved_model.save")
    meta = proto.meta_graphs[0]
    if not meta.HasField("object_graph_def") or not meta.object_graph_def.nodes:
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
    return SavedModelInfo(str(path), tuple(functions), signatures, proto,
                          keras_export=any(c.local_name == KERAS_EXPORT_MARK for c in nodes[0].children))


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
    return tuple(n.attr["f"].func.name for n in fdef.node_def if n.op in CALL_OP_TYPES)


#: What every "nothing to rewrite" error says to do (docs/guide.md has the example).
HOW_TO_SAVE = ("Save the training step itself: a tf.Module holding the model and optimizer, with a tf.function "
               "training method that has an input_signature, written with tf.saved_model.save (a Keras "
               "model.export() directory holds only inference functions); docs/guide.md, 'A SavedModel that tflms "
               "rewrite accepts', shows one")


#: The attribute Keras's ExportArchive sets on the object ``model.export()`` saves (Keras 3 and tf_keras alike:
#: ``_tf_trackable._misc_assets``, its lookup tables); a ``tf.Module`` a user saves has no reason to carry it.
KERAS_EXPORT_MARK = "_misc_assets"


def keras_export_message(info: SavedModelInfo) -> str:
    """Why a Keras ``model.export()`` directory has nothing to rewrite, and what to do instead."""
    names = ", ".join(f.path for f in info.functions) or "none"
    return (f"{info.path} was written by Keras's model.export(): it holds the model's inference endpoints ({names}), "
            "the forward pass in inference mode, without the loss, the optimizer or any gradient. So it has no "
            "training step to rewrite, and none can be rebuilt from it. Instead: train the Keras model with the "
            "callback, model.fit(..., callbacks=[tflms.keras.LMS()]); to ask whether it fits, save it with "
            "model.save('model.keras') and run tflms estimate model.keras --batch N. To rewrite offline, save the "
            "training step itself: a tf.Module holding the model and optimizer, with a tf.function training method "
            "that has an input_signature, written with tf.saved_model.save (docs/guide.md, 'A SavedModel that tflms "
            "rewrite accepts', shows one)")


def select_functions(info: SavedModelInfo, names: Sequence[str] | None) -> tuple[list[FunctionInfo], bool]:
    """The functions to work on and whether they were named explicitly."""
    if not info.functions:
        raise SavedModelError(f"the SavedModel {info.path} has no functions (no tf.function or ConcreteFunction "
                              f"attribute): there is no training step to rewrite. {HOW_TO_SAVE}")
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
        children = trackable_children(obj)
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

