"""Verification: run every rewritten trace once in both models and compare outputs and variables bit for bit."""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tflms.config import LMSConfig
from tflms.errors import SavedModelError
from tflms.integrations.savedmodel.read import SavedModelInfo, _load, _resolve, _tf, _traces

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

