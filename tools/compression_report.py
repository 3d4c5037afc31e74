"""Compressed swapping on a real CNN: measured sparsity, codec decisions, simulated swap and step time.

Builds a small VGG-like Keras CNN (Conv2D+ReLU blocks with max pooling, a Dense
head; batch 32 of 64x64x3 by default), traces one SGD training step, plans
vDNN's offloads (:mod:`tflms.policies.vdnn`) and runs the step's forward part *once*
on random inputs to measure every offloaded feature map (:mod:`tflms.compress.profiling`;
the model's variables are not changed). Then, per hardware profile, it lets the
cost model (:mod:`tflms.compress.policy`) pick the tensors to compress and simulates
(:func:`tflms.sim.simulate`) the step with

- ``none``: no swapping;
- ``vdnn_conv`` / ``vdnn_all``: vDNN's offloads, plain copies (``vdnn_all`` is the
  vDNN baseline CSwap+ compares with);
- ``vdnn_all+cswap``: the same offloads, compressed where the cost model says so
  (lossless zero-value compression only);
- ``vdnn_all+cswap-lossy``: the same, allowing fp16/bf16/int8 too (lossy: only
  with the user's consent, shown for comparison).

Reported figures from the papers are printed next to ours and labelled
"reported": cDMA's average ZVC compression ratio of 2.6x on trained networks
(Rhu et al., HPCA 2018, arXiv:1705.01626) and CSwap+'s "up to 50.9% less swap
latency than vDNN" on a V100 (Chen et al., IEEE TPDS 2022, doi:10.1109/TPDS.2022.3193867).
Our activations come from a randomly initialised network after one step, which
is less sparse than the trained networks of those papers.

    python tools/compression_report.py                    # tables
    python tools/compression_report.py --json > out.json  # one JSON document
    python tools/compression_report.py --batch-size 8 --image-size 32 --profiles v100-16gb-pcie3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

DEFAULT_PROFILES = ("v100-16gb-pcie3", "h100-80gb-pcie5")
DEFAULT_BATCH = 32
DEFAULT_IMAGE = 64
DEFAULT_FILTERS = (32, 64, 128)
DEFAULT_CLASSES = 10
DEFAULT_SEED = 0
#: cDMA's average compression ratio over the networks it studies (reported, arXiv:1705.01626).
REPORTED_CDMA_ZVC_RATIO = 2.6
#: CSwap+'s best reduction of swap latency against vDNN on a V100 (reported, doi:10.1109/TPDS.2022.3193867).
REPORTED_CSWAP_LATENCY_REDUCTION = 0.509


def build_cnn(image: int, filters: Sequence[int], classes: int, seed: int):
    """A VGG-like CNN: per block two 3x3 Conv2D+ReLU and a 2x2 max pool; then Dense(256)+ReLU and logits."""
    import keras
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((image, image, 3))
    h = inputs
    for b, f in enumerate(filters):
        for c in range(2):
            h = keras.layers.Conv2D(f, 3, padding="same", activation="relu", name=f"block{b}_conv{c}")(h)
        h = keras.layers.MaxPooling2D(name=f"block{b}_pool")(h)
    h = keras.layers.Flatten(name="flatten")(h)
    h = keras.layers.Dense(256, activation="relu", name="fc")(h)
    return keras.Model(inputs, keras.layers.Dense(classes, name="logits")(h), name="vgg_like")


def traced_step(batch: int, image: int, filters: Sequence[int], classes: int, seed: int):
    """The model, its optimizer, the traced training step and one batch of inputs."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tflms.testing import make_train_step
    model = build_cnn(image, filters, classes, seed)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))

    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((batch, image, image, 3)).astype(np.float32))
    y = tf.constant(rng.integers(0, classes, batch).astype(np.int32))
    return model, optimizer, step.get_concrete_function(x, y), (x, y)


def _row(name: str, plan, sim, baseline, extra: dict | None = None) -> dict[str, Any]:
    row = {"strategy": name, "swaps": 0 if plan is None else len(plan.swaps),
           "swapped_bytes": 0 if plan is None else plan.swapped_bytes, "peak_bytes": sim.peak_bytes,
           "transfer_time_s": sim.transfer_time_s, "stall_time_s": sim.stall_time_s,
           "compute_time_s": sim.compute_time_s, "step_time_s": sim.step_time_s,
           "overhead": sim.overhead_vs(baseline)}
    row.update(extra or {})
    return row


def _codec_compute_s(sim) -> float:
    names = [r for r in sim.ops if r.name.startswith(("lms/encode_", "lms/decode_"))]
    return sum(r.end_s - r.start_s for r in names)


def run(batch: int = DEFAULT_BATCH, image: int = DEFAULT_IMAGE, filters: Sequence[int] = DEFAULT_FILTERS,
        classes: int = DEFAULT_CLASSES, profiles: Sequence[str] = DEFAULT_PROFILES, seed: int = DEFAULT_SEED,
        progress=None) -> dict[str, Any]:
    """Everything the report prints, as one JSON-serializable dict."""
    from tflms.analysis.cto import analyze_graph
    from tflms.compress.policy import decide_compression, simulate_compressed
    from tflms.compress.profiling import profile_tensors
    from tflms.config import LMSConfig
    from tflms.ir import tf_io
    from tflms.passes.swaps import apply_swaps
    from tflms.sim import SimOptions, simulate
    from tflms.policies.vdnn import VDNN_ALL, VDNN_CONV, plan_vdnn

    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    model, optimizer, concrete, args = traced_step(batch, image, filters, classes, seed)
    graph = tf_io.from_concrete_function(concrete)
    analysis = analyze_graph(graph)
    config = LMSConfig()
    accelerator = "/device:GPU:0"  # planning for the profiled GPU, whatever this machine has
    plans = {p: plan_vdnn(analysis, p, config, accelerator_device=accelerator) for p in (VDNN_CONV, VDNN_ALL)}
    rewritten = {p: apply_swaps(graph, plan).graph for p, plan in plans.items()}
    candidates = [s.tensor for s in plans[VDNN_ALL].swaps]
    say(f"traced: {len(graph)} ops; vdnn_all offloads {len(candidates)} feature maps; profiling one step")
    stats = profile_tensors(concrete, args, candidates, graph=graph)
    say(f"profiled in {stats.elapsed_s:.1f} s")
    options = SimOptions(host_device=config.host_device)
    result: dict[str, Any] = {
        "model": {"name": model.name, "batch_size": batch, "image_size": image, "filters": list(filters),
                  "ops": len(graph), "parameters": int(sum(v.numpy().size for v in model.trainable_variables))},
        "profiling": stats.to_dict(),
        "zvc_ratio": {"measured": stats.zvc_ratio(), "reported_cdma_average": REPORTED_CDMA_ZVC_RATIO,
                      "reported_source": "cDMA, Rhu et al., HPCA 2018 (arXiv:1705.01626)"},
        "profiles": {},
    }
    del optimizer
    for name in profiles:
        baseline = simulate(graph, name, options=options)
        rows = [_row("none", None, baseline, baseline)]
        sims = {}
        for policy in (VDNN_CONV, VDNN_ALL):
            sims[policy] = simulate(rewritten[policy], name, options=options)
            rows.append(_row(policy, plans[policy], sims[policy], baseline))
        decisions = {}
        for label, lossy in (("vdnn_all+cswap", False), ("vdnn_all+cswap-lossy", True)):
            decision = decide_compression(rewritten[VDNN_ALL], plans[VDNN_ALL], stats, name, allow_lossy=lossy,
                                          sim=sims[VDNN_ALL], sim_options=options)
            _, sim = simulate_compressed(rewritten[VDNN_ALL], plans[VDNN_ALL], decision.choices, name,
                                         allow_lossy=lossy, sim_options=options)
            codec_s = _codec_compute_s(sim)
            vdnn_s = sims[VDNN_ALL].transfer_time_s
            rows.append(_row(label, plans[VDNN_ALL], sim, baseline, {
                "compressed": len(decision.choices), "codec_compute_s": codec_s,
                "swap_latency_reduction_vs_vdnn": 1 - sim.transfer_time_s / vdnn_s if vdnn_s else 0.0,
                "swap_plus_codec_reduction_vs_vdnn": 1 - (sim.transfer_time_s + codec_s) / vdnn_s if vdnn_s else 0.0}))
            decisions[label] = decision
        result["profiles"][name] = {
            "rows": rows,
            "decisions": {label: d.to_dict() for label, d in decisions.items()},
            "tables": {label: d.table() for label, d in decisions.items()},
            "reported_cswap_latency_reduction_vs_vdnn": REPORTED_CSWAP_LATENCY_REDUCTION,
        }
        say(f"{name}: simulated")
    result["elapsed_s"] = time.perf_counter() - t0
    return result


def format_report(result: dict[str, Any]) -> str:
    m = result["model"]
    lines = [f"model {m['name']}: batch {m['batch_size']}, {m['image_size']}x{m['image_size']}x3, filters "
             f"{m['filters']}, {m['parameters']:,} parameters, {m['ops']} ops in the step", "",
             "measured activations (vDNN's offloaded feature maps, one profiling step):"]
    prof = result["profiling"]
    lines.append(f"{'tensor':<46}{'MiB':>8}{'sparsity':>10}{'zvc ratio':>11}")
    for t in prof["tensors"]:
        lines.append(f"{t['tensor'][-45:]:<46}{t['num_bytes'] / 2**20:>8.2f}{t['sparsity']:>10.3f}"
                     f"{t['zvc_ratio']:>11.2f}")
    z = result["zvc_ratio"]
    lines.append(f"size-weighted sparsity {prof['mean_sparsity']:.3f}; overall ZVC ratio {z['measured']:.2f}x measured "
                 f"(reported: {z['reported_cdma_average']}x average, {z['reported_source']}, trained networks)")
    for name, data in result["profiles"].items():
        lines += ["", f"== {name} =="]
        lines.append(data["tables"]["vdnn_all+cswap"])
        lossy = data["decisions"]["vdnn_all+cswap-lossy"]
        chosen = [f"{t['tensor'].split('/')[-2] if '/' in t['tensor'] else t['tensor']}:{t['codec']}"
                  for t in lossy["tensors"] if t["codec"]]
        lines.append(f"with lossy codecs allowed: {len(chosen)} compressed ({', '.join(chosen) or 'none'})")
        lines.append("")
        lines.append(f"{'strategy':<24}{'swaps':>6}{'swapped MiB':>12}{'peak MiB':>10}{'transfer ms':>12}"
                     f"{'stall ms':>10}{'step ms':>10}{'overhead':>10}{'swap -%':>9}")
        for r in data["rows"]:
            red = r.get("swap_latency_reduction_vs_vdnn")
            lines.append(f"{r['strategy']:<24}{r['swaps']:>6}{r['swapped_bytes'] / 2**20:>12.2f}"
                         f"{r['peak_bytes'] / 2**20:>10.1f}{r['transfer_time_s'] * 1e3:>12.3f}"
                         f"{r['stall_time_s'] * 1e3:>10.3f}{r['step_time_s'] * 1e3:>10.3f}"
                         f"{100 * r['overhead']:>9.1f}%{'' if red is None else f'{100 * red:>8.1f}%'}")
        lines.append(f"swap -%: simulated copy time saved against vdnn_all (reported: up to "
                     f"{100 * data['reported_cswap_latency_reduction_vs_vdnn']:.1f}% for CSwap+ vs vDNN on a V100, "
                     "Chen et al., IEEE TPDS 2022)")
    lines.append("")
    lines.append(f"elapsed {result['elapsed_s']:.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH)
    parser.add_argument("--image-size", type=int, default=DEFAULT_IMAGE)
    parser.add_argument("--filters", type=int, nargs="+", default=list(DEFAULT_FILTERS),
                        help="filters of each conv block (two convs and a pool per block)")
    parser.add_argument("--profiles", nargs="+", default=list(DEFAULT_PROFILES))
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.image_size < 2 ** len(args.filters):
        parser.error("--batch-size must be >= 1 and --image-size >= 2**(number of blocks)")
    try:
        import tflms
        del tflms
    except ImportError:  # run from a checkout that is not installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tflms.errors import TflmsError
    try:
        result = run(args.batch_size, args.image_size, args.filters, DEFAULT_CLASSES, args.profiles, args.seed,
                     progress=None if args.json else (lambda msg: print(msg, file=sys.stderr)))
    except TflmsError as err:
        parser.error(str(err))
    print(json.dumps(result, indent=2, default=str) if args.json else format_report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
