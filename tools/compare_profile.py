"""Compare what a GPU measured (``tools/gpu_probe.py``'s JSON) with what tflms's cost model predicts on a profile.

Every measured figure is priced again through the code the planner uses: the probe's matrix products,
its convolution and its device-to-device copy are traced as TensorFlow ops and priced by
:func:`tflms.sim.cost.op_time_s`; host copies by :meth:`HardwareProfile.copy_time_s`. Each row shows the
measured rate, the rate the profile predicts and their ratio, for the profile the device is matched to
(:func:`tflms.profiles.profile_for_device`, or ``--profile``) and for the probe's own JSON loaded as a profile.
A probe run with ``--conv-layers`` adds ResNet-50's stride-1 convolutions, forward and backward: their FLOPs over
the measured time (each layer at its faster layout) against the same over the priced ``Conv2D``,
``Conv2DBackpropInput`` and ``Conv2DBackpropFilter`` ops of a traced gradient. A probe run with ``--batchnorm`` adds
training-mode batch norm on ResNet-50's activations: per layer and dtype, the measured seconds (at the faster layout)
against the priced ``FusedBatchNormV3`` and ``FusedBatchNormGradV3`` of a traced gradient, their ratio
measured / predicted and its geometric mean per dtype. A probe run with ``--attention`` adds BERT's attention chain
(scores, scale, softmax, Keras 3's stateless dropout): per dtype, each op's measured seconds against the priced
TensorFlow ops traced for it (:data:`gpu_probe.ATTENTION_OPS`, each traced op named after the probe's op), the chain
back to back against the sum of its priced ops, the pinned copies of its largest tensor out and back against
:meth:`HardwareProfile.copy_time_s`, and the ratio the tuner's recompute-or-swap rule reads (the chain's time over
the two copies'), measured against predicted.

    python tools/compare_profile.py docs/profiles/h100-80gb-hbm3.json
    python tools/compare_profile.py docs/profiles/h200.json --profile h200-141gb --json
    python tools/compare_profile.py docs/profiles/h100-80gb-hbm3-elementwise.json \
        docs/profiles/h100-80gb-hbm3-conv-layers.json --fit-conv    # the fit pools both runs

The simulator runs copies on their own streams beside compute, so it predicts that a copy and a product
running together each take the time they take alone; the probe's ``overlap`` figures check that.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_probe import (ATTENTION_DROPOUT, ATTENTION_OPS, CONV_SHAPE,  # noqa: E402 (the probe's shapes and counts)
                       attention_tensor_bytes, batchnorm_best, conv_flops, elementwise_bytes)

#: The probe's matrix-product modes, the TensorFlow dtype each is traced in, and whether TF32 is on.
MODES = {"fp32": ("float32", False), "tf32": ("float32", True), "fp16": ("float16", True),
         "bf16": ("bfloat16", True)}
#: The probe's convolution dtypes. PyTorch runs a float32 convolution as TF32 by default
#: (``torch.backends.cudnn.allow_tf32``), as TensorFlow does (``enable_tensor_float_32_execution``).
CONV_DTYPES = ("float32", "bfloat16")


def _graph(fn, *specs):
    import tensorflow as tf
    from tflms.ir.tf_io import load_graph
    return load_graph(tf.function(fn).get_concrete_function(*specs))


@functools.lru_cache(maxsize=None)
def _traced(kind: str, shape: tuple[int, ...], dtype: str):
    """The IR of one probed operation, traced once whatever the profiles it is priced on: ``matmul`` (square,
    ``shape`` = (n,)), ``conv`` (forward), ``conv_step`` (forward and both gradients; both at gpu_probe's
    (batch, channels in, channels out, side, kernel), channels-last), ``batchnorm_step`` (a training-mode
    fused batch norm and its gradient, at gpu_probe's (batch, channels, side), channels-last: :data:`BATCHNORM_TF`),
    ``attention`` (BERT's attention chain on Q and K of gpu_probe's (batch, heads, sequence, head size):
    :func:`_attention_chain`), ``copy`` (a DeepCopy of ``shape``) or one of :data:`ELEMENTWISE_TF`."""
    import tensorflow as tf
    dt = getattr(tf, dtype)
    if kind == "matmul":
        spec = tf.TensorSpec((shape[0], shape[0]), dt)
        return _graph(tf.matmul, spec, spec)
    if kind == "copy":
        return _graph(lambda x: tf.raw_ops.DeepCopy(x=x), tf.TensorSpec(shape, dt))
    if kind in ("conv", "conv_step"):
        batch, c_in, c_out, hw, k = shape
        x, w = tf.TensorSpec((batch, hw, hw, c_in), dt), tf.TensorSpec((k, k, c_in, c_out), dt)
        if kind == "conv":
            return _graph(lambda x, w: tf.nn.conv2d(x, w, 1, "SAME"), x, w)

        def step(x, w, dy):
            with tf.GradientTape() as tape:
                tape.watch([x, w])
                y = tf.nn.conv2d(x, w, 1, "SAME")
            return tape.gradient(y, [x, w], output_gradients=dy)
        return _graph(step, x, w, tf.TensorSpec((batch, hw, hw, c_out), dt))
    if kind == "batchnorm_step":
        batch, channels, hw = shape

        def bn_step(x, scale, offset, mean, variance, dy):
            with tf.GradientTape() as tape:
                tape.watch([x, scale, offset])
                y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, mean, variance, is_training=True,
                                                           exponential_avg_factor=0.01, data_format="NHWC")
            return tape.gradient(y, [x, scale, offset], output_gradients=dy)
        act, per_channel = tf.TensorSpec((batch, hw, hw, channels), dt), tf.TensorSpec((channels,), tf.float32)
        return _graph(bn_step, act, per_channel, per_channel, per_channel, per_channel, act)
    if kind == "attention":
        qk = tf.TensorSpec(shape, dt)
        return _graph(_attention_chain(tf, dt, shape), qk, qk, tf.TensorSpec((2,), tf.int32))
    spec = tf.TensorSpec(shape, dt)
    return _graph(ELEMENTWISE_TF[kind][1](tf), spec, spec)


def _attention_chain(tf, dt, shape: tuple[int, ...]):
    """BERT's attention probabilities as a Keras 3 model traces them (``tools/benchlib/models.py``'s SelfAttention:
    ``ops.softmax(ops.matmul(q, ops.transpose(k)) * head_size ** -0.5)``, then ``keras.layers.Dropout``, which is
    ``tf.nn.experimental.stateless_dropout``), written out op by op so that each op carries the name of the probe's op
    (:data:`gpu_probe.ATTENTION_OPS`): the uniform's ops are ``uniform/StatelessRandomUniformV2``, ``uniform/mul`` and
    ``uniform`` (``tf.random.stateless_uniform``'s x * (max - min) + min, a Mul by 1 and an AddV2 of 0 that grappler
    folds away before the step runs: only the uniform is priced). K's transpose is the product's
    ``adj_y`` (Keras traces a Transpose of K, 1/8 the size of the scores, before it; not priced here)."""
    batch, heads, seq, size = shape

    def chain(q, k, seed):
        scores = tf.linalg.matmul(q, k, transpose_b=True, name="scores")
        probs = tf.nn.softmax(tf.multiply(scores, tf.constant(size ** -0.5, dt), name="scale"), axis=-1,
                              name="softmax")
        uniform = tf.random.stateless_uniform((batch, heads, seq, seq), seed, dtype=dt, name="uniform")
        mask = tf.math.greater_equal(uniform, tf.constant(ATTENTION_DROPOUT, dt), name="mask")
        rescaled = tf.multiply(probs, tf.constant(1 / (1 - ATTENTION_DROPOUT), dt), name="rescale")
        return tf.where(mask, rescaled, tf.zeros((), dt), name="select")
    return chain


def attention_ops(graph, name: str, op_types: tuple[str, ...]) -> list:
    """The ops of the traced attention chain that stand for the probe's op ``name``: those named ``name`` or under
    ``name/`` whose type is one of ``op_types`` (a scalar ``uniform/sub`` of two constants, and the ops grappler folds, are left
    out). Refused
    unless they are exactly ``op_types``: the probe's names and the trace must not drift apart."""
    ops = [op for op in graph if (op.name == name or op.name.startswith(name + "/")) and op.type in op_types]
    if sorted(op.type for op in ops) != sorted(op_types):
        raise ValueError(f"the traced attention chain has {sorted(op.type for op in ops)} for {name!r}, "
                         f"not gpu_probe.ATTENTION_OPS's {sorted(op_types)}")
    return ops


def _priced(graph, op_type: str, profile) -> float:
    from tflms.sim.cost import op_time_s
    [op] = [op for op in graph if op.type == op_type]
    return op_time_s(graph, op, profile)


def predictions(measurements: dict[str, Any], profile) -> dict[str, float]:
    """The rates ``profile`` predicts for the probe's operations, keyed as :func:`measured` keys them:
    FLOP/s for products and the convolution, bytes/s for copies (a device copy counts bytes read plus written)."""
    out: dict[str, float] = {}
    n = int(measurements["matmul_n"])
    for mode, (dtype, tf32) in MODES.items():
        out[f"matmul {mode}"] = 2 * n**3 / _priced(_traced("matmul", (n,), dtype), "MatMul", profile.with_tf32(tf32))
    shape = tuple(measurements.get("conv_shape", CONV_SHAPE))
    for dtype in CONV_DTYPES:
        out[f"conv {dtype}"] = conv_flops(shape) / _priced(_traced("conv", shape, dtype), "Conv2D",
                                                           profile.with_tf32(True))
    nbytes = int(measurements["copy_bytes"])
    out["device copy"] = 2 * nbytes / _priced(_traced("copy", (nbytes // 4,), "float32"), "DeepCopy", profile)
    for direction in ("h2d", "d2h"):
        out[f"host {direction} pinned"] = nbytes / profile.copy_time_s(nbytes)
    return out


def conv_layer_times(layers: dict[str, Any], profile) -> dict[str, dict[str, float]]:
    """Per dtype, the measured and predicted seconds of a training step's convolutions (``gpu_probe.py
    --conv-layers``): each layer's forward and backward at its faster measured layout, against
    :func:`op_time_s` of the ops TensorFlow's gradient builds (``Conv2D``, ``Conv2DBackpropInput``,
    ``Conv2DBackpropFilter``), traced channels-last."""
    from tflms.sim.cost import op_time_s
    best: dict[tuple[str, tuple[int, ...]], float] = {}
    for layer in layers["layers"]:
        flops = conv_flops(layer["shape"])
        seconds = flops / layer["forward_flops"] + (2 * flops / layer["backward_flops"] if layer["backward_flops"]
                                                     else 0.0)
        key = (layer["dtype"], tuple(layer["shape"]))
        best[key] = min(best.get(key, seconds), seconds)
    out: dict[str, dict[str, float]] = {}
    for (dtype, shape), seconds in sorted(best.items()):
        graph = _traced("conv_step", shape, dtype)
        predicted = sum(op_time_s(graph, op, profile.with_tf32(True)) for op in graph
                        if op.type.startswith("Conv2D"))
        totals = out.setdefault(dtype, {"flops": 0.0, "measured_s": 0.0, "predicted_s": 0.0})
        totals["flops"] += 3 * conv_flops(shape)
        totals["measured_s"] += seconds
        totals["predicted_s"] += predicted
    return out


def fit_conv_efficiency(runs: list[dict[str, Any]], profile, dtypes: tuple[str, ...] | None = None) -> float:
    """The ``conv_efficiency`` at which ``profile`` predicts the measured convolutions of every run in ``runs``
    (``conv_layers`` objects): the geometric mean of predicted over measured time, over the runs and ``dtypes``
    (default: every measured dtype), is 1. Bisection (the predicted time falls as the efficiency rises;
    memory-bound layers keep their memory time)."""
    import dataclasses
    import math

    def log_error(efficiency: float) -> float:
        trial = dataclasses.replace(profile, conv_efficiency=efficiency)
        chosen = [t for layers in runs for dtype, t in conv_layer_times(layers, trial).items()
                  if dtypes is None or dtype in dtypes]
        return sum(math.log(t["predicted_s"] / t["measured_s"]) for t in chosen) / len(chosen)

    low, high = 0.01, 1.0
    if log_error(high) > 0:
        return high  # slower than measured even at the full peak: nothing to fit
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (middle, high) if log_error(middle) > 0 else (low, middle)
    return round((low + high) / 2, 3)


#: gpu_probe's element-wise ops as TensorFlow ops: the traced function and the op type priced.
ELEMENTWISE_TF = {"relu": ("Relu", lambda tf: lambda x, y: tf.nn.relu(x)),
                  "add": ("AddV2", lambda tf: lambda x, y: x + y),
                  "mul": ("Mul", lambda tf: lambda x, y: x * tf.constant(0.5, x.dtype)),
                  "sum": ("Sum", lambda tf: lambda x, y: tf.reduce_sum(x, axis=(0, 1, 2)))}


def elementwise_rate(op: str, shape: tuple[int, ...], dtype: str, profile) -> float:
    """Bytes read and written per second that ``profile`` predicts for gpu_probe's element-wise ``op``
    (``gpu_probe.elementwise_bytes`` over :func:`op_time_s` of the traced TensorFlow op)."""
    return elementwise_bytes(op, shape, dtype) / _priced(_traced(op, shape, dtype), ELEMENTWISE_TF[op][0], profile)


#: gpu_probe's batch norm passes and the TensorFlow op each is priced as. The forward is the op Keras 2's
#: ``BatchNormalization(fused=True)`` traces under training (``tf.compat.v1.nn.fused_batch_norm``, moving statistics
#: updated with momentum 0.99; Keras 3 builds batch norm from separate ops instead). bfloat16 traces as on a GPU:
#: a bfloat16 activation with float32 scale, offset and statistics, each activation-sized tensor priced at 2 bytes.
BATCHNORM_TF = (("forward", "FusedBatchNormV3"), ("backward", "FusedBatchNormGradV3"))


def batchnorm_times(section: dict[str, Any], profile) -> list[dict[str, Any]]:
    """Per layer and dtype of ``gpu_probe.py --batchnorm`` (its faster measured layout,
    ``gpu_probe.batchnorm_best``): for each pass of :data:`BATCHNORM_TF`, the measured seconds, the seconds
    :func:`op_time_s` prices the traced op at, and their ratio measured / predicted."""
    rows = []
    for (dtype, shape), layer in batchnorm_best(section["layers"]).items():
        graph = _traced("batchnorm_step", shape, dtype)
        row: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "layout": layer["layout"]}
        for which, op_type in BATCHNORM_TF:
            seconds, predicted = layer[f"{which}_s"], _priced(graph, op_type, profile)
            row[which] = {"measured_s": seconds, "predicted_s": predicted, "ratio": seconds / predicted}
        rows.append(row)
    return rows


def batchnorm_geomean(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per dtype, the geometric mean over :func:`batchnorm_times`' layers of the ratio measured / predicted, per
    pass and over both passes (``all``)."""
    import statistics
    ratios: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        per_pass = ratios.setdefault(row["dtype"], {which: [] for which, _ in BATCHNORM_TF} | {"all": []})
        for which, _ in BATCHNORM_TF:
            per_pass[which].append(row[which]["ratio"])
            per_pass["all"].append(row[which]["ratio"])
    return {dtype: {k: statistics.geometric_mean(v) for k, v in per_pass.items()} for dtype, per_pass in ratios.items()}


def attention_times(section: dict[str, Any], profile) -> dict[str, Any]:
    """Per dtype of ``gpu_probe.py --attention`` (dtypes that failed left out): each op of
    :data:`gpu_probe.ATTENTION_OPS` measured against :func:`op_time_s` summed over the TensorFlow ops traced for it
    (float32 products as TF32, as TensorFlow runs them); the chain measured back to back against the sum of those
    (the simulator runs a recompute's ops one after another); the pinned copies of one chain tensor, each direction
    against :meth:`HardwareProfile.copy_time_s`; and ``recompute_over_copy``, the chain's time over the two copies',
    measured and predicted. Every ``ratio`` is measured / predicted. ``geomean_ratio``: per dtype, the geometric mean
    of the ops' ratios."""
    import statistics
    from tflms.sim.cost import op_time_s
    shape = tuple(section["shape"])
    out: dict[str, Any] = {"dtypes": {}, "geomean_ratio": {}}
    tf32 = profile.with_tf32(True)
    for dtype, entry in section["dtypes"].items():
        if entry.get("error"):
            continue
        graph = _traced("attention", shape, dtype)
        ops = []
        for name, _, op_types in ATTENTION_OPS:
            seconds = entry["ops"][name]["seconds"]
            predicted = sum(op_time_s(graph, op, tf32) for op in attention_ops(graph, name, op_types))
            ops.append({"op": name, "tf_ops": list(op_types), "measured_s": seconds, "predicted_s": predicted,
                        "ratio": seconds / predicted})
        chain = sum(op["predicted_s"] for op in ops)
        nbytes = int(entry["tensor_bytes"])
        if nbytes != attention_tensor_bytes(shape, dtype):
            raise ValueError(f"--attention {dtype}: tensor_bytes {nbytes} is not a {shape} chain's tensor")
        copy_s = profile.copy_time_s(nbytes)  # either direction
        copies = {direction: {"measured_s": entry[f"{direction}_s"], "predicted_s": copy_s,
                              "ratio": entry[f"{direction}_s"] / copy_s} for direction in ("d2h", "h2d")}
        copy_predicted = sum(c["predicted_s"] for c in copies.values())
        measured_ratio, predicted_ratio = entry["chain_s"] / entry["copy_s"], chain / copy_predicted
        out["dtypes"][dtype] = {
            "ops": ops,
            "chain": {"measured_s": entry["chain_s"], "predicted_s": chain, "ratio": entry["chain_s"] / chain},
            "tensor_bytes": nbytes, "copies": copies,
            "copy": {"measured_s": entry["copy_s"], "predicted_s": copy_predicted,
                     "ratio": entry["copy_s"] / copy_predicted},
            "recompute_over_copy": {"measured": measured_ratio, "predicted": predicted_ratio,
                                    "ratio": measured_ratio / predicted_ratio}}
        out["geomean_ratio"][dtype] = statistics.geometric_mean([op["ratio"] for op in ops])
    return out


def measured(measurements: dict[str, Any]) -> dict[str, float]:
    out = {f"matmul {mode}": rate for mode, rate in measurements["matmul_flops"].items() if rate}
    out.update({f"conv {dtype}": rate for dtype, rate in (measurements.get("conv_flops") or {}).items() if rate})
    out["device copy"] = measurements["hbm_gbps"] * 1e9
    for direction in ("h2d", "d2h"):
        out[f"host {direction} pinned"] = measurements["link_gbps"][f"{direction}_pinned"] * 1e9
    return out


def compare(probe: dict[str, Any], profile_names: list[str] | None = None, fit_conv: bool = False,
            also: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """``probe`` against its matched profile (or ``profile_names``) and its own JSON as a profile; with
    ``fit_conv``, each profile's ``conv_efficiency`` fitted to the convolutions of ``probe`` and of ``also``
    (more runs of the same GPU, pooled)."""
    from tflms.profiles import HardwareProfile, get_profile, profile_for_device
    device = probe["device"]
    names = profile_names or [profile_for_device(device["name"], device.get("memory_bytes")).name]
    profiles = [get_profile(name) for name in names] + [HardwareProfile.from_dict(probe["profile"])]
    got = measured(probe["measurements"])
    rows = []
    predicted = {p.name: predictions(probe["measurements"], p) for p in profiles}
    rates = probe["measurements"].get("elementwise_gbps") or {}
    for key, value in rates.items():
        if key == "shape" or not value:
            continue
        op, dtype = key.split()
        got[f"{op} {dtype}"] = value * 1e9
        for p in profiles:
            predicted[p.name][f"{op} {dtype}"] = elementwise_rate(op, tuple(rates["shape"]), dtype, p)
    layers = probe["measurements"].get("conv_layers") or {}
    if layers.get("layers"):
        for p in profiles:
            for dtype, totals in conv_layer_times(layers, p).items():
                predicted[p.name][f"ResNet-50 convs {dtype}"] = totals["flops"] / totals["predicted_s"]
                got[f"ResNet-50 convs {dtype}"] = totals["flops"] / totals["measured_s"]
    for key, rate in got.items():
        rows.append({"figure": key, "measured": rate,
                     **{p.name: {"predicted": predicted[p.name][key], "ratio": predicted[p.name][key] / rate}
                        for p in profiles}})
    overlap = {direction: {k: v for k, v in figures.items() if k.endswith("_vs_alone")}
               for direction, figures in (probe["measurements"].get("overlap") or {}).items()}
    result = {"device": device, "profiles": [p.name for p in profiles], "rows": rows, "overlap": overlap}
    batchnorm = probe["measurements"].get("batchnorm") or {}
    if batchnorm.get("layers"):
        result["batchnorm"] = {}
        for p in profiles:
            times = batchnorm_times(batchnorm, p)
            result["batchnorm"][p.name] = {"layers": times, "geomean_ratio": batchnorm_geomean(times)}
        failed = [layer for layer in batchnorm["layers"] if layer.get("error")]
        if failed:
            result["batchnorm_failed"] = failed
    attention = probe["measurements"].get("attention") or {}
    if attention.get("dtypes"):
        result["attention"] = {p.name: attention_times(attention, p) for p in profiles}
        result["attention_shape"] = {"shape": attention["shape"], "dropout_rate": attention["dropout_rate"]}
        failed = {dtype: entry["error"] for dtype, entry in attention["dtypes"].items() if entry.get("error")}
        if failed:
            result["attention_failed"] = failed
    elif attention.get("not_measured"):
        result["attention_failed"] = {"all": attention["not_measured"]}
    runs = [r for r in [layers] + [(a["measurements"].get("conv_layers") or {}) for a in also] if r.get("layers")]
    if fit_conv and runs:
        dtypes = sorted({layer["dtype"] for run in runs for layer in run["layers"]})
        result["conv_efficiency"] = {p.name: {"all": fit_conv_efficiency(runs, p),
                                              **{d: fit_conv_efficiency(runs, p, (d,)) for d in dtypes}}
                                     for p in profiles}
        result["conv_runs"] = len(runs)
        result["conv_efficiency_now"] = {p.name: p.conv_efficiency for p in profiles}
    return result


def _unit(key: str, rate: float) -> str:
    return f"{rate / 1e12:.1f} TFLOP/s" if key.startswith(("matmul", "conv", "ResNet")) else f"{rate / 1e9:.0f} GB/s"


def table(result: dict[str, Any]) -> str:
    device = result["device"]
    lines = [f"{device['name']} (driver {device.get('driver', '?')}, {device.get('library', '?')}): measured "
             "against the cost model (tflms.sim.cost.op_time_s; predicted / measured)", "",
             "| figure | measured | " + " | ".join(result["profiles"]) + " |",
             "|---|---|" + "---|" * len(result["profiles"])]
    for row in result["rows"]:
        cells = [f"{_unit(row['figure'], row[p]['predicted'])} ({row[p]['ratio']:.2f})" for p in result["profiles"]]
        lines.append(f"| {row['figure']} | {_unit(row['figure'], row['measured'])} | " + " | ".join(cells) + " |")
    for direction, figures in result["overlap"].items():
        lines.append(f"\n{direction} copy during a product: copy {figures.get('copy_vs_alone', float('nan')):.2f}x "
                     f"its time alone, product {figures.get('product_vs_alone', float('nan')):.2f}x "
                     "(the simulator assumes 1.00x for both)")
    lines.extend(batchnorm_table(result))
    lines.extend(attention_table(result))
    for name, fits in result.get("conv_efficiency", {}).items():
        lines.append(f"\n{name}: conv_efficiency that predicts the measured ResNet-50 convolutions "
                     f"({result['conv_runs']} run{'s' if result['conv_runs'] > 1 else ''}): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in fits.items())
                     + f" (now {_now(result['conv_efficiency_now'][name])})")
    return "\n".join(lines)


def batchnorm_table(result: dict[str, Any]) -> list[str]:
    """:func:`table`'s batch norm lines: per layer, dtype and pass, the measured time (its faster layout) and each
    profile's predicted time (ratio measured / predicted); then per profile, the geometric mean ratio per dtype."""
    if not result.get("batchnorm"):
        return []
    names = result["profiles"]
    lines = ["", "batch norm, training (FusedBatchNormV3 forward, FusedBatchNormGradV3 backward): measured at the "
             "faster layout against the predicted time (measured / predicted)", "",
             "| shape (batch, channels, side) | dtype | pass | measured | " + " | ".join(names) + " |",
             "|---|---|---|---|" + "---|" * len(names)]
    per_profile = [result["batchnorm"][name]["layers"] for name in names]
    for rows in zip(*per_profile):
        first = rows[0]
        for which, _ in BATCHNORM_TF:
            cells = [f"{row[which]['predicted_s'] * 1e6:.0f} us ({row[which]['ratio']:.2f})" for row in rows]
            lines.append(f"| {tuple(first['shape'])} | {first['dtype']} | {which} | "
                         f"{first[which]['measured_s'] * 1e6:.0f} us {first['layout']} | " + " | ".join(cells) + " |")
    for name in names:
        lines.append(f"\n{name}: batch norm measured / predicted, geometric mean: " + "; ".join(
            f"{dtype} " + ", ".join(f"{k} {v:.2f}" for k, v in ratios.items())
            for dtype, ratios in result["batchnorm"][name]["geomean_ratio"].items()))
    for layer in result.get("batchnorm_failed", []):
        lines.append(f"batch norm {tuple(layer['shape'])} {layer['dtype']} {layer['layout']} failed: {layer['error']}")
    return lines


def attention_table(result: dict[str, Any]) -> list[str]:
    """:func:`table`'s attention lines: per dtype, each op, the chain and the copies, measured against each profile's
    predicted time (measured / predicted), and the ratio recompute / copies measured against predicted; then per
    profile the geometric mean of the ops' ratios per dtype."""
    lines = []
    if result.get("attention"):
        names = result["profiles"]
        batch, heads, seq, size = result["attention_shape"]["shape"]
        lines += ["", f"attention chain (batch {batch}, {heads} heads, sequence {seq}, head size {size}, dropout "
                  f"{result['attention_shape']['dropout_rate']}): measured against the predicted time "
                  "(measured / predicted); recompute / copies: the chain's time over the pinned copies out and back "
                  f"of one {batch}x{heads}x{seq}x{seq} tensor", "",
                  "| dtype | op (TensorFlow ops priced) | measured | " + " | ".join(names) + " |",
                  "|---|---|---|" + "---|" * len(names)]
        per_profile = [result["attention"][name]["dtypes"] for name in names]
        for dtype, first in per_profile[0].items():
            rows = [p[dtype] for p in per_profile]

            def cells(pick) -> str:
                return " | ".join(f"{pick(row)['predicted_s'] * 1e6:.1f} us ({pick(row)['ratio']:.2f})" for row in rows)
            for i, op in enumerate(first["ops"]):
                lines.append(f"| {dtype} | {op['op']} ({', '.join(op['tf_ops'])}) | {op['measured_s'] * 1e6:.1f} us | "
                             + cells(lambda row: row["ops"][i]) + " |")
            lines.append(f"| {dtype} | chain, back to back (predicted: the ops' sum) | "
                         f"{first['chain']['measured_s'] * 1e6:.1f} us | " + cells(lambda row: row["chain"]) + " |")
            for direction in ("d2h", "h2d"):
                lines.append(f"| {dtype} | {direction} copy, pinned, {first['tensor_bytes'] / 2**20:.0f} MiB | "
                             f"{first['copies'][direction]['measured_s'] * 1e6:.1f} us | "
                             + cells(lambda row: row["copies"][direction]) + " |")
            lines.append(f"| {dtype} | recompute / copies | {first['recompute_over_copy']['measured']:.3f} | "
                         + " | ".join(f"{row['recompute_over_copy']['predicted']:.3f} "
                                      f"({row['recompute_over_copy']['ratio']:.2f})" for row in rows) + " |")
        for name in names:
            lines.append(f"\n{name}: attention ops measured / predicted, geometric mean: " + ", ".join(
                f"{dtype} {mean:.2f}" for dtype, mean in result["attention"][name]["geomean_ratio"].items()))
    for dtype, error in result.get("attention_failed", {}).items():
        lines.append(f"attention {dtype}: not measured: {error}")
    return lines


def _now(conv_efficiency: float | None) -> str:
    return "unset: the products' efficiency" if conv_efficiency is None else f"{conv_efficiency}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("probe", nargs="+", help="JSON files written by tools/gpu_probe.py: the first is compared; "
                        "--fit-conv pools the convolutions of all (runs of the same GPU)")
    parser.add_argument("--profile", action="append", help="a profile to compare (repeatable; default: the "
                        "registered profile matched to the probe's device)")
    parser.add_argument("--fit-conv", action="store_true", help="also fit each profile's conv_efficiency to the "
                        "measured ResNet-50 convolutions (a probe run with --conv-layers)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    probes = []
    for path in args.probe:
        try:
            with open(path) as f:
                probe = json.load(f)
            probe["device"], probe["measurements"], probe["profile"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            parser.error(f"{path}: not a tools/gpu_probe.py JSON file ({err!r})")
        probes.append(probe)
    names = {p["device"]["name"] for p in probes}
    if len(names) > 1:
        parser.error(f"the probe files measured different GPUs ({sorted(names)}): give runs of one GPU")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = compare(probes[0], args.profile, fit_conv=args.fit_conv, also=probes[1:])
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
