"""Verification: run every rewritten trace once in both models and compare outputs and variables bit for bit."""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tflms._compat.tf import trackable_children
from tflms.config import LMSConfig
from tflms.errors import SavedModelError
from tflms.faults import fault_point
from tflms.integrations.savedmodel.read import SavedModelInfo, _load, _resolve, _tf, _traces

from tflms.integrations.savedmodel.write import NOTHING_WRITTEN
from tflms.ir.op_types import PYTHON_CALLBACK_OPS

if TYPE_CHECKING:
    from tflms.integrations.savedmodel.rewrite import TraceRewrite

#: Size of every unknown dimension of the example inputs of ``verify`` when the config has no ``batch_size``.
VERIFY_UNKNOWN_DIM = 2
#: Seed of the example inputs of ``verify`` (floating point inputs are uniform in [-1, 1)).
VERIFY_SEED = (17, 42)


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


def _run(concrete_function, args, kwargs, where: str, config: LMSConfig) -> list:
    tf = _tf()
    try:
        return tf.nest.flatten(concrete_function(*args, **kwargs))
    except (tf.errors.OpError, ValueError, TypeError) as err:
        raise _run_error(err, where, "running", config) from err


def _run_error(err: Exception, where: str, doing: str, config: LMSConfig) -> SavedModelError:
    """A specific error for a failure to run a trace on example inputs (out of memory above all)."""
    tf = _tf()
    dim = config.batch_size or VERIFY_UNKNOWN_DIM
    first_line = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
    sizes = f"{dim} for every unknown dimension ({'--batch-size' if config.batch_size else 'the default'})"
    if isinstance(err, tf.errors.ResourceExhaustedError):
        return SavedModelError(f"--verify ran out of memory {doing} {where} with {sizes}: {first_line}. Verify with "
                               "a smaller --batch-size (a separate run with --batch-size 2 --verify checks the same "
                               "graph), or run without --verify" + NOTHING_WRITTEN)
    return SavedModelError(f"--verify failed {doing} {where} on example inputs ({sizes}): {type(err).__name__}: "
                           f"{first_line}. Run without --verify and check the output model with your own data"
                           + NOTHING_WRITTEN)





def check_verifiable(concrete_function, where: str) -> None:
    """A :class:`SavedModelError` if ``verify`` cannot run this trace (inputs it cannot make, Python callbacks).

    Checked before anything is saved, so that ``--verify`` fails fast with the
    reason; the rewrite itself supports these traces.
    """
    tf = _tf()
    function_type = getattr(concrete_function, "function_type", None)
    params = ([(name, p.type_constraint) for name, p in function_type.parameters.items()]
              if function_type is not None else [("input", concrete_function.structured_input_signature)])
    for name, constraint in params:
        for spec in tf.nest.flatten(constraint):
            if isinstance(spec, tf.TypeSpec) and not isinstance(spec, tf.TensorSpec):
                raise SavedModelError(
                    f"--verify cannot run {where}: its input {name!r} is a {type(spec).__name__} ({spec}), and "
                    "verification makes example inputs for plain tensors (tf.TensorSpec) only. Run without "
                    "--verify (the rewrite supports it) and check the output model with your own data"
                    + NOTHING_WRITTEN)
    graph_def = concrete_function.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    for node in nodes:
        if node.op in PYTHON_CALLBACK_OPS:
            raise SavedModelError(
                f"--verify cannot run {where}: it calls Python through tf.py_function or tf.numpy_function (op "
                f"{node.name!r}, type {node.op}), whose code is not saved in a SavedModel, so neither the loaded "
                "input nor the output can run it. Run without --verify (the rewrite supports it) and check the "
                "output model in the program that defines that Python function" + NOTHING_WRITTEN)


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
            children = trackable_children(obj)
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
    fault_point("during-verify")
    for t in rewritten:
        finfo = info.function(t.function)
        cf_before = _traces(_resolve(before, t.function), finfo)[t.trace]
        cf_after = _traces(_resolve(after, t.function), finfo)[t.trace]
        where = f"function {t.function!r} ({t.signature})"
        check_verifiable(cf_before, where)
        try:
            args, kwargs = example_inputs(cf_before, config.batch_size)
        except tf.errors.OpError as err:
            raise _run_error(err, where, "making example inputs for", config) from err
        out_before = _run(cf_before, args, kwargs, f"{where} of the input model", config)
        out_after = _run(cf_after, args, kwargs, f"{where} of the output model", config)
        for i, (a, b) in enumerate(zip(out_before, out_after)):
            if np.asarray(a).tobytes() != np.asarray(b).tobytes():
                raise SavedModelError(f"verification failed: {where} output {i} differs; nothing was written")
        for path in sorted(vars_before):
            a, b = vars_before[path].numpy(), vars_after[path].numpy()
            if a.tobytes() != b.tobytes():
                diff = np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0.0
                raise SavedModelError(f"verification failed: after {where}, variable {path!r} differs "
                                      f"(max |diff| {diff:g}); nothing was written")

