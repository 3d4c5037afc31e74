"""The benchmark's output: JSON records, the Markdown report (docs/results.md) and memory-timeline plots."""

from __future__ import annotations

import datetime
import os
import pathlib
import platform

from .common import BOUND, METHODS, QUICK_BISECT_STEPS, REPORTED, UNET_RESOLUTION_STEP, say, unet_shape
from .models import MODELS, size_amount, size_label
from .search import MethodResult


def records_for(model: str, profile: str, results: dict[str, MethodResult]) -> list[dict]:
    """JSON records, one per method (and the bound). Sizes are batches (ints), or for a resolution model
    volume labels (``"208x192x192"``, ``"192^3"``, ``"0"`` = nothing fits) with ``max_shape`` and
    ``max_voxels`` beside them; ratios (``fraction_of_bound``) compare batches or voxels."""
    batch = MODELS[model].kind == "batch"

    def size(s):
        return s if batch else size_label(model, s)

    out = []
    bound = results.get(BOUND)
    for method in METHODS + ((BOUND,) if bound is not None else ()):
        r = results[method]
        out.append({
            "model": model, "profile": profile, "method": method,
            "max_batch": size(r.max_size),
            "max_shape": None if batch or not r.max_size else list(unet_shape(r.max_size)),
            "max_voxels": None if batch else size_amount(model, r.max_size),
            "overhead_pct": None if r.overhead is None else round(100 * r.overhead, 2),
            "rewrite_s": round(r.rewrite_s, 3),
            "ops": r.ops,
            "unit": "batch" if batch else "resolution (D x H x W volume, batch 1)",
            "max_batch_upper": None if r.upper is None else size(r.upper),
            "common_batch": size(r.common),
            "search_s": round(r.search_s, 2),
            "peak_bytes_at_common": None if r.sim is None else r.sim.peak_with_margin_bytes,
            "step_ms_at_common": None if r.sim is None else round(1e3 * r.sim.step_time_s, 3),
            "clock": None if r.sim is None else getattr(r.sim, "clock", None),
            "probes": [[size(s), f] for s, f in sorted(r.probes)],
            "detail": r.detail,
            "bound_batch": None if bound is None else size(bound.max_size),
            # max as a fraction of the bound (resolution models: of the bound's voxels)
            "fraction_of_bound": (None if bound is None or not bound.max_size else
                                  round(size_amount(model, r.max_size) / size_amount(model, bound.max_size), 4)),
            "step_ms_at_max": None if r.step_s_at_max is None else round(1e3 * r.step_s_at_max, 3),
            "samples_per_s_at_max": None if r.samples_per_s_at_max is None else round(r.samples_per_s_at_max, 2),
            "time_bound_ratio_at_max": (None if r.time_bound_ratio_at_max is None
                                        else round(r.time_bound_ratio_at_max, 3)),
            "time_across_ratio_at_max": (None if r.time_across_ratio_at_max is None
                                         else round(r.time_across_ratio_at_max, 3)),
            "time_bound_ratio_first_fit_at_max": (None if r.time_bound_ratio_first_fit_at_max is None
                                                  else round(r.time_bound_ratio_first_fit_at_max, 3)),
            "time_bound_ratio_unpruned_at_max": (None if r.time_bound_ratio_unpruned_at_max is None
                                                 else round(r.time_bound_ratio_unpruned_at_max, 3)),
            "floor_bound_ratio_at_max": (None if r.floor_bound_ratio_at_max is None
                                         else round(r.floor_bound_ratio_at_max, 3)),
            "error": r.error,
            **({"curve": curve_points(model, r)} if r.curve else {}),
        })
    return out


def curve_points(model: str, r: MethodResult) -> list[list]:
    """``[[batch, samples/s, step ms], ...]`` of ``r``'s throughput curve (``bench.py --curve``); samples/s and step
    ms are ``None`` at a batch the method does not fit."""
    del model  # batch models only: samples per step = batch
    return [[batch, None if step_s is None else round(batch / step_s, 3),
             None if step_s is None else round(1e3 * step_s, 3)] for batch, step_s in r.curve]


def at_records(model: str, profile: str, results: dict[str, MethodResult], *, budget_bytes: int,
               headroom: float) -> list[dict]:
    """JSON records of ``bench.py --at``: every method at one given size (no maximum searched).

    ``peak_bytes`` is the simulated peak with headroom (``None`` when no graph was produced: a tune that
    found nothing); ``fits`` is that peak within ``budget_bytes``; ``overhead_pct`` the step time over the
    unchanged step's at the same size (unlimited memory), ``None`` when it does not fit; ``detail`` the
    choice (tuner strategy and parameters, grappler's swaps, checkpoint-segments's segments, keras-remat's
    mode; ``failed: <the error's first line>`` where a traced step could not be built or traced: ``error``)."""
    batch = MODELS[model].kind == "batch"
    out = []
    for method in METHODS:
        r = results[method]
        out.append({
            "model": model, "profile": profile, "method": method,
            "unit": "batch" if batch else "resolution (D x H x W volume, batch 1)",
            "size": r.common if batch else size_label(model, r.common),
            "headroom": headroom,
            "budget_bytes": budget_bytes,
            "fits": r.overhead is not None,
            "overhead_pct": None if r.overhead is None else round(100 * r.overhead, 2),
            "peak_bytes": None if r.sim is None else r.sim.peak_with_margin_bytes,
            "step_ms": None if r.sim is None else round(1e3 * r.sim.step_time_s, 3),
            "rewrite_s": round(r.rewrite_s, 3),
            "ops": r.ops,
            "detail": r.detail,
            "error": r.error,
        })
    return out


def at_markdown(records: list[dict], *, command: str) -> str:
    """``bench.py --at``'s report: a table per profile of every method at the given sizes."""
    lines = ["# Every method at given sizes (simulated)", "", "Produced by", "", f"    {command}", "",
             "**overhead** = predicted step time at the size over the unchanged step's on a GPU with unlimited "
             "memory, minus 1 (`-` = does not fit); **peak** = simulated peak times (1 + headroom), judged "
             "against the budget; **choice** = what the method ran (the tuner's strategy and parameters, "
             "grappler's swaps, checkpoint-segments's segments, keras-remat's mode; `failed: ...` = the step "
             "could not be built or traced, with the error's first line).", ""]
    for profile in dict.fromkeys(r["profile"] for r in records):
        rows = [r for r in records if r["profile"] == profile]
        lines += [f"## {profile} (headroom {rows[0]['headroom']:g}, budget "
                  f"{rows[0]['budget_bytes'] / 2**30:.2f} GiB)", "",
                  "| model | size | method | overhead | peak | fits | step ms | rewrite s | choice |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            overhead = "-" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
            peak = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f} GiB"
            step = "-" if r["step_ms"] is None else f"{r['step_ms']:.1f}"
            choice = r["detail"].partition("; ")[2] or "-"
            fits = "failed" if r.get("error") else "yes" if r["fits"] else "no"
            lines.append(f"| {r['model']} | {r['size']} | {r['method']} | {overhead} | {peak} | "
                         f"{fits} | {step} | {r['rewrite_s']:.1f} | {_cell(choice)} |")
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (an error message may hold ``|``)."""
    return text.replace("|", "\\|")


def _failed(record: dict) -> str:
    """``"failed: <the error's first line>"``, what a row of a method whose step failed shows instead of a size."""
    return _cell(f"failed: {record['error']}")


def _ratio(record: dict, base: dict) -> str:
    if record["unit"] != "batch":  # resolution: compare voxels
        return f"{record['max_voxels'] / base['max_voxels']:.2f}x vox" if base["max_voxels"] else "-"
    if not base["max_batch"]:
        return "-"
    return f"{record['max_batch'] / base['max_batch']:.2f}x"


def _clock_lines(records: list[dict]) -> list[str]:
    """A sentence on the simulator's clocks the records were priced with (tflms.sim.clock), and a blank line."""
    clocks = {r["method"]: r.get("clock") for r in records if r.get("clock")}
    if not clocks:
        return []
    none = clocks.get("none")
    tflms = clocks.get("tflms-best") or clocks.get("tflms-distance")
    if none == "xla":
        return [f"Clocks (`tflms.sim.clock`): `none` and the traced checkpointing steps as **XLA** compiles them (what "
                f"a Keras 3 user runs on a GPU by default); tflms's and grappler's rewrites on the **{tflms or 'graph'}** "
                "clock (TensorFlow's executor without XLA: tflms's XLA clusters between swap points, issue 47, are not "
                "priced yet), so their overhead includes what leaving XLA costs.", ""]
    return [f"Clock (`tflms.sim.clock`): **{none or tflms}** for every method"
            + (" (TensorFlow's executor on a GPU: launches overlap compute, no XLA)." if (none or tflms) == "graph"
               else "."), ""]


def markdown(records: list[dict], *, command: str, mode: str, elapsed_s: float, plots: dict[str, str],
             extras: dict[str, list[str]] | None = None, bisect_steps: int = QUICK_BISECT_STEPS) -> str:
    """The report; ``extras``: more sections (title -> Markdown lines) placed before "How the numbers were produced";
    ``bisect_steps``: the quick mode's bisection steps (``--bisect-steps``)."""
    import tensorflow as tf
    models = list(dict.fromkeys(r["model"] for r in records))
    profiles = list(dict.fromkeys(r["profile"] for r in records))
    by = {(r["model"], r["profile"], r["method"]): r for r in records}
    lines = [
        "# Benchmark results: tflms beside the alternatives",
        "",
        "Produced by",
        "",
        f"    {command}",
        "",
        f"on {datetime.date.today().isoformat()} ({mode} mode, {elapsed_s / 60:.1f} min wall time; "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, TensorFlow {tf.__version__}). "
        "Every number below is **predicted by the tflms simulator** (`tflms.sim.simulate`) from the traced "
        "training step and the hardware profile; nothing ran on a GPU. The papers' figures at the end are "
        "**reported** by their authors, not measured here.",
        "",
        *_clock_lines(records),
        "## Methods",
        "",
        "| method | what runs |",
        "|---|---|",
        "| `none` | the traced step unchanged |",
        "| `tflms-distance` | tflms, TFLMS's distance rules only: `tune(..., strategies=[\"tflms-distance\"])` "
        "(swap-out threshold, swap-in ahead/group-by, sync mode searched by simulation) |",
        "| `tflms-best` | tflms, every tuner strategy (`tflms.tune.tuner.STRATEGIES`: distance rules, "
        "idle-time, idle-time-no-overhead); the fastest fitting rewrite wins |",
        "| `grappler` | TensorFlow grappler's memory optimizer alone, `RewriterConfig.SWAPPING_HEURISTICS`, via "
        "`tf_optimizer.OptimizeGraph` on a virtual cluster whose GPU has the profile's memory, FLOP/s and memory "
        "bandwidth (`tflms.baselines.grappler_swap`); its `_CopyFromGpuToHost`/`_CopyFromHostToGpu` pairs are "
        "read back into the IR and simulated as device-to-host / host-to-device copies |",
        "| `checkpoint-segments` | gradient checkpointing of the same Keras model: sqrt(n) equal segments of its "
        "layer calls, each under `tf.recompute_grad` (`tflms.baselines.recompute`), traced as its own step |",
        "| `keras-remat` | the same Keras model built under `keras.RematScope(mode=\"full\")` (Keras 3: every "
        "layer call rematerialized with `tf.recompute_grad`), traced as its own step; `failed: ...` where Keras "
        "cannot build or trace it, with the error's first line |",
        "| `keras-remat-activations` | the same, `keras.RematScope(mode=\"activations\")`: only the activation "
        "functions of layers that have one are rematerialized |",
        "",
        "Columns: **max** is the largest batch that fits the profile's memory (for `unet3d`: the largest volume "
        f"D x H x W at batch 1, sides multiples of {UNET_RESOLUTION_STEP} that differ by at most "
        f"{UNET_RESOLUTION_STEP}, in increasing voxel order: n^3 < (n+1)n^2 < (n+1)^2n < (n+1)^3; its ratios are in "
        "voxels); **overhead** is the predicted step time at the *common "
        "batch* relative to the unchanged step on a GPU with unlimited memory (the common batch is the smallest "
        "of the maxima that exceed `none`'s, so every method that extends the batch runs there; `-` = does not "
        "fit there); **rewrite s** is the wall time of the tune or rewrite that produced the graph at the common "
        "batch (tflms: one full tune; grappler: export + OptimizeGraph + read-back; checkpoint-segments and "
        "keras-remat: tracing their step); **ops** is that graph's size.",
        "",
    ]
    for profile in profiles:
        lines += [f"## {profile}", "",
                  "| model | common | " + " | ".join(f"{m} max (x none)" for m in METHODS) + " |",
                  "|---|---|" + "---|" * len(METHODS)]
        for model in models:
            if (model, profile, "none") not in by:
                continue
            base = by[(model, profile, "none")]
            cells = []
            for m in METHODS:
                r = by[(model, profile, m)]
                if r.get("error"):
                    cells.append("failed")  # the error's first line: the tables below
                    continue
                cell = f"{r['max_batch']}{'+' if r['max_batch_upper'] is None else ''}"
                cells.append(cell if m == "none" else f"{cell} ({_ratio(r, base)})")
            lines.append(f"| {model} | {base['common_batch']} | " + " | ".join(cells) + " |")
        lines += ["", "Each method at its own maximum, against the swap-only bound (`tflms.sim.bounds.swap_only_bound`: "
                  "resident bytes plus the largest single op's working set, judged with the same headroom, and "
                  "`tflms.sim.footprint.footprint_bound` within the accelerator and the profile's host memory "
                  "together): "
                  "**of bound** = max / bound (voxels for `unet3d`); **samples/s** = max / predicted step time; "
                  "**time/bound** = predicted step time over the step-time bound at the budget left by the "
                  "headroom (`time_bound_ratio`, the smaller bound of level order and the schedule); for the "
                  "tflms methods the step is the full tune's choice at the maximum (pruning included), not the "
                  "first plan the max-size probe found; **time/across** = the same over the tighter bound "
                  "across the peak (`TimeBound.across_bound_s`: bytes away at an instant leave before it and come "
                  "back after it, so the two copies cannot overlap; docs/design.md, \"Bounds\"); **floor/bound** = "
                  "the least time/bound any swap-only rewrite can have at that size, in any execution order "
                  "(`tflms.sim.bounds.any_order_time_bound`; above 1.25, issue 11's target is out of reach there).",
                  "",
                  "| model | method | max | of bound | x none | step ms | samples/s | time/bound | time/across | "
                  "floor/bound |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for model in models:
            base = by.get((model, profile, "none"))
            for m in METHODS + (BOUND,):
                r = by.get((model, profile, m))
                if r is None or base is None:
                    continue
                if r.get("error"):
                    lines.append(f"| {model} | {m} | {_failed(r)} | - | - | - | - | - | - | - |")
                    continue
                frac = "-" if r.get("fraction_of_bound") is None else f"{100 * r['fraction_of_bound']:.0f}%"
                step = "-" if r.get("step_ms_at_max") is None else f"{r['step_ms_at_max']:.0f}"
                rate = "-" if r.get("samples_per_s_at_max") is None else f"{r['samples_per_s_at_max']:.1f}"
                tbr = "-" if r.get("time_bound_ratio_at_max") is None else f"{r['time_bound_ratio_at_max']:.2f}"
                tar = "-" if r.get("time_across_ratio_at_max") is None else f"{r['time_across_ratio_at_max']:.2f}"
                fbr = "-" if r.get("floor_bound_ratio_at_max") is None else f"{r['floor_bound_ratio_at_max']:.2f}"
                lines.append(f"| {model} | {m} | {r['max_batch']} | {frac} | {_ratio(r, base)} | {step} | {rate} | "
                             f"{tbr} | {tar} | {fbr} |")
        lines += ["", "| model | method | max | upper | overhead at common | peak at common | rewrite s | ops | "
                  "search s | detail |", "|---|---|---|---|---|---|---|---|---|---|"]
        for model in models:
            for m in METHODS:
                r = by.get((model, profile, m))
                if r is None:
                    continue
                if r.get("error"):
                    lines.append(f"| {model} | {m} | {_failed(r)} | - | - | - | {r['rewrite_s']:.1f} | - | "
                                 f"{r['search_s']:.1f} | {_cell(r['detail'])} |")
                    continue
                overhead = "-" if r["overhead_pct"] is None else f"{r['overhead_pct']:+.1f}%"
                peak = "-" if r["peak_bytes_at_common"] is None else f"{r['peak_bytes_at_common'] / 2**30:.2f} GiB"
                lines.append(f"| {model} | {m} | {r['max_batch']} | {r['max_batch_upper'] or '-'} | {overhead} | "
                             f"{peak} | {r['rewrite_s']:.1f} | {r['ops']} | {r['search_s']:.1f} | {r['detail']} |")
        lines.append("")
    lines += ["## Reported by the papers (not measured here)", "",
              "| source | setting | reported | ours (tflms-best, simulated) |", "|---|---|---|---|"]
    for source, setting, figure, model, kind in REPORTED:
        ours = []
        for profile in profiles:
            r, base = by.get((model, profile, "tflms-best")), by.get((model, profile, "none"))
            if r and base and kind == "ratio":
                ours.append(f"{profile}: {_ratio(r, base)} ({base['max_batch']} -> {r['max_batch']})")
        if kind == "vdnn-like-for-like":
            ours.append("at the same 2.33x over-subscription: `python tools/vdnn_like_for_like.py` (section "
                        "\"vDNN like for like\" below, when present)")
        lines.append(f"| {source} | {setting} | {figure} (reported) | {'; '.join(ours) or 'n/a'} |")
    lines += ["", "The papers ran on other hardware (TFLMS: POWER9 + V100 over NVLink; vDNN: Titan X over PCIe 3) "
              "with their own batch-size steps and allocators; compare trends, not digits.", ""]
    if plots:
        lines += ["## Memory timelines", "",
                  "Accelerator memory over one simulated step at the common batch: the unchanged step (`none`, which "
                  "may exceed the budget there) against each method; the dashed line is the budget.", ""]
        for key, path in plots.items():
            lines.append(f"![{key}]({path})")
        lines.append("")
    for title, body in (extras or {}).items():
        lines += [f"## {title}", "", *body, ""]
    lines += ["## How the numbers were produced", "",
              "- Search: doubling from a known fit until a size does not fit, then bisection. `none` starts at 1; "
              "`tflms-distance`, `grappler`, `checkpoint-segments` and the `keras-remat` methods start at `none`'s "
              "maximum, `tflms-best` at "
              "`tflms-distance`'s (sizes the unchanged step fits are fitted by tflms without tuning); each tries "
              "the previous method's first miss before doubling. "
              + (f"Quick mode bisects {bisect_steps} times: a maximum is a size that fits, and **upper** "
                 f"(the smallest size found not to fit) is at most 1/{2 ** bisect_steps} above it (for `unet3d`: "
                 "in size steps, the volumes in the order above), or the next size once the two are adjacent."
                 if mode == "quick"
                 else "Full mode bisects until **upper** (the smallest size found not to fit) is the next size "
                 "(max + 1; for `unet3d` the next volume in the order above).")
              + " Every maximum is then read off all probes of the run (a size `none` fits counts for the tflms "
              "methods, one `tflms-distance` fits for `tflms-best`), and `none` is probed at the other methods' "
              "sizes inside its last interval, so that all methods are compared at the same resolution.",
              "- tflms probes (does anything fit at this size?): "
              + ("`tflms-distance` simulates the tuner's two most aggressive distance candidates (swap-out "
                 "threshold 1, asynchronous and fully synchronous): a fit is exact (the tuner tries them too), a "
                 "miss could hide another fitting candidate, so the maximum is a lower bound; "
                 if mode == "quick" else "`tflms-distance` runs `tune(strategies=[\"tflms-distance\"], "
                 "first_fit=True)`; ")
              + "`tflms-best` runs `tune(first_fit=True, enforce_order=True)` (every strategy; finalists judged "
              "in the order the pipeline's order pass enforces) where the distance rules miss. One full tune with every strategy runs at the common batch; the "
              "tuner evaluates the distance candidates first, so `tflms-distance`'s choice and wall time are "
              "read off the same run (its fastest fitting distance candidate, the time of its last one).",
              f"- The 3D U-Net is re-traced at every probed volume (sides multiples of {UNET_RESOLUTION_STEP}, "
              "the larger sides first, batch 1); each trace is cached for the run. Batch models are traced once "
              "with an unknown batch dimension and re-sized in the IR (`Graph.with_batch_size`).",
              "- grappler decides from its own static memory estimate, not the simulator's: it counts every output "
              "as a fresh allocation (no buffer forwarding), so it is larger where grappler knows every shape, "
              "and it counts a dimension its shape inference cannot resolve as 1, so it is far smaller there "
              "(BERT's attention tensors: 6.9 GiB estimated vs 56 GiB simulated at batch 67, and no swaps). It "
              "swaps only consumers that run after its estimated peak, only tensors live for over 1 ms of its "
              "virtual time, and runs one swapping pass (`SwappingPass` never reports an update, so its 25-pass "
              "loop stops after one). Its choice can differ from run to run by a few swaps (seen on the 3D U-Net: "
              "45 or 46 swaps at 160^3), probably from iterating hash maps keyed by node pointers.",
              "- `checkpoint-segments` and `keras-remat` recompute whole Keras layer calls: BatchNormalization "
              "updates its moving statistics twice per step and Dropout (BERT) draws new masks when recomputed. "
              "(\"recompute\" in tflms names the tuner's plan action, which re-runs single ops from the graph; "
              "earlier reports called `checkpoint-segments` `recompute`.)",
              ""]
    return "\n".join(lines)


#: Plot colour and line width of each method (timelines and throughput curves).
STYLES = {"none": ("black", 1.6), "tflms-distance": ("tab:green", 1.0), "tflms-best": ("tab:blue", 1.2),
          "grappler": ("tab:orange", 1.0), "checkpoint-segments": ("tab:purple", 1.0),
          "keras-remat": ("tab:brown", 1.0), "keras-remat-activations": ("tab:pink", 1.0)}


#: Marker of each method on the throughput curve, in METHODS order.
CURVE_MARKERS = ("s", "o", "^", "D", "v", "P", "X")


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend, or ``None`` (said once per plot) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        say("matplotlib is not installed: no plots (pip install -e \".[plot]\")")
        return None
    return plt


def plot_timelines(path: pathlib.Path, model: str, profile: str, results: dict[str, MethodResult],
                   budget_bytes: int, label: str) -> bool:
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(9, 4.2))
    styles = STYLES
    same = results["tflms-best"].sim is not None and results["tflms-best"].sim is results["tflms-distance"].sim
    for method in METHODS:
        sim = results[method].sim
        if sim is None or (method == "tflms-distance" and same):
            continue
        t = [1e3 * p[0] for p in sim.timeline]
        gib = [p[1] / 2**30 for p in sim.timeline]
        color, width = styles[method]
        ax.step(t, gib, where="post", color=color, linewidth=width,
                label=f"{method}{' = tflms-distance' if method == 'tflms-best' and same else ''} "
                      f"(peak {sim.peak_bytes / 2**30:.1f} GiB, step {1e3 * sim.step_time_s:.0f} ms)")
    ax.axhline(budget_bytes / 2**30, color="red", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("simulated time in the step (ms)")
    ax.set_ylabel("accelerator memory (GiB)")
    ax.set_title(f"{model} on {profile} at {label} (simulated)")
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def curve_markdown(records: list[dict], plots: dict[str, str]) -> list[str]:
    """The "Throughput curve" section (``bench.py --curve``): per profile and model, simulated samples/s of every
    method at each sampled batch (``-``: does not fit; ``failed``: its step could not be built or traced), and the
    plots (title -> path)."""
    lines = ["Samples/s **predicted by the simulator** against batch size, from `none`'s maximum to the swap-only "
             "bound, each method's own rewrite at each batch (as at the common batch: the full tune for the tflms "
             "methods, grappler's rewrite, the traced checkpoint-segments and keras-remat steps): samples/s = "
             "batch / simulated step time; `-` = the method does not fit that batch (peak with headroom over the "
             "budget); `failed` = its step could not be built or traced (its error: the tables above).", ""]
    curves = [r for r in records if r.get("curve")]
    for profile in dict.fromkeys(r["profile"] for r in curves):
        for model in dict.fromkeys(r["model"] for r in curves if r["profile"] == profile):
            rows = {r["method"]: r for r in curves if (r["model"], r["profile"]) == (model, profile)}
            methods = [m for m in METHODS if m in rows]
            batches = [point[0] for point in rows[methods[0]]["curve"]]
            lines += [f"### {model} on {profile} (samples/s, simulated)", "",
                      "| batch | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
            for i, batch in enumerate(batches):
                cells = []
                for m in methods:
                    rate = rows[m]["curve"][i][1]
                    cells.append("failed" if rows[m].get("error") else "-" if rate is None else f"{rate:.1f}")
                lines.append(f"| {batch} | " + " | ".join(cells) + " |")
            lines.append("")
            key = f"{model} on {profile}"
            if key in plots:
                lines += [f"![{key}: samples/s against batch size, simulated]({plots[key]})", ""]
    return lines[:-1] if lines[-1] == "" else lines


def plot_curve(path: pathlib.Path, model: str, profile: str, results: dict[str, MethodResult]) -> bool:
    """Samples/s against batch, a line per method over the batches it fits, with ``none``'s maximum and the bound."""
    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for i, method in enumerate(METHODS):
        points = [(b, b / s) for b, s in results[method].curve if s is not None]
        color, width = STYLES[method]
        if results[method].error or not points:  # in the legend, so that a missing line is explained
            ax.plot([], [], color=color, linewidth=width,
                    label=f"{method} ({'failed' if results[method].error else 'fits no sampled batch'})")
            continue
        # markers shrink method by method: methods with the same samples/s (tflms-best keeping the unchanged
        # step) show as nested markers instead of hiding each other
        ax.plot([b for b, _ in points], [v for _, v in points], marker=CURVE_MARKERS[i % len(CURVE_MARKERS)],
                markersize=9 - i, fillstyle="none", color=color, linewidth=width, label=method)
    for name, style in (("none", ":"), (BOUND, "--")):
        if name in results and results[name].max_size:
            ax.axvline(results[name].max_size, color="grey", linestyle=style, linewidth=0.8,
                       label=f"{name} max {results[name].max_size}")
    ax.set_xlabel("batch size")
    ax.set_ylabel("samples/s (simulated)")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{model} on {profile}: throughput against batch size (simulated)")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
