"""The ``tflms-xla`` method and issue 47's simulated targets (``bench.py --xla-targets``).

``tflms-xla`` is tflms keeping XLA: the step's clusters between tflms's copies, every candidate priced on the
``xla-clusters`` clock (:mod:`tflms.sim.clusters`), as ``rewrite_step(xla=True)`` tunes. It is measured against the
plain XLA step (``none`` on the ``xla`` clock) and against segment checkpointing priced under XLA
(``checkpoint-segments`` on the ``xla`` clock), per model and profile:

- the largest batch of each (quick search: doubling, then ``bisect_steps`` bisections; tflms-xla's probes are
  first-fit tunes in level order, starting from checkpointing's maximum);
- **target 1**: at checkpointing's maximum, tflms-xla's overhead against the plain XLA step (on a GPU with unlimited
  memory) is at most half of checkpointing's;
- **target 2**: at tflms-xla's maximum, its samples/s is at least 0.5x the plain XLA step's at its own maximum;
  where it is not, the largest batch found at which it is (:func:`throughput_met_max`, the nearest target met).

tflms-xla's step at both sizes is the step the pipeline runs: the full tune's choice (every strategy, the finalists in
the enforced order, as the pipeline tunes), held to the budget in TensorFlow's executor as the pipeline holds it, or
the next fastest fit that can be held where it cannot (:func:`tflms.pipeline.held.hold_tuned`; the record's ``tuned``
then says what the tune chose and why it was passed over). Every figure is simulated.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from .common import HEADROOM, say
from .search import Evaluator, budget_for, search_max

METHOD = "tflms-xla"
#: The issue's targets: tflms-xla's overhead at most this fraction of checkpointing's; its samples/s at its maximum at
#: least this fraction of the plain XLA step's at its own.
OVERHEAD_FRACTION = 0.5
THROUGHPUT_FRACTION = 0.5
#: Halvings of the gap in the search for the largest batch at which target 2 holds, where it fails at tflms-xla's
#: maximum (:func:`throughput_met_max`): each probe a full tune (up to half an hour on BERT-base on two cores), so
#: the batch found lies within a sixteenth of the gap of the last one that holds, if samples/s fall with the batch.
THROUGHPUT_BISECTIONS = 4


def xla_options(options: Any) -> Any:
    """``options`` on the ``xla-clusters`` clock (the margin kept)."""
    from tflms.sim.clock import CLOCK_XLA_CLUSTERS
    return dataclasses.replace(options, clock=CLOCK_XLA_CLUSTERS)


def tune_xla(graph, ev: Evaluator, *, first_fit: bool, progress=None):
    """tflms-xla's tune of ``graph`` and the simulator options its winner was tuned on (``(None, None)`` where nothing
    fits), its variables' updates in parts where the step as it is does not fit (``update_parts_for``, as the
    pipeline tunes)."""
    from tflms.errors import BudgetError, GraphError
    from tflms.passes.shapes import materialize_gradient_shapes
    from tflms.pipeline.hardware import update_parts_for
    from tflms.tune.tuner import DEFAULT_STRATEGIES, tune
    from tflms.tune.xla_cuts import tune_xla as each_way
    graph = materialize_gradient_shapes(graph, resolved=True).graph  # as the pipeline's XLA path
    try:
        options = update_parts_for(xla_options(ev.options), graph, ev.profile, ev.budget)
        result, chosen = each_way(  # as the pipeline tunes: again with land cuts where the winner swaps, and with
            # the clones ordered last where it is a hybrid
            lambda o: tune(graph, budget=ev.budget, profile=ev.profile, strategies=list(DEFAULT_STRATEGIES),
                           first_fit=first_fit, sim_options=o, enforce_order=not first_fit, progress=progress),
            options, fit_only=first_fit)
        return result, chosen
    except BudgetError:
        return None, None
    except GraphError as err:  # a candidate the tuner built could not be run: said, and counted as no fit
        say(f"{ev.model} {ev.profile.name} {METHOD}: the tune failed: {str(err)[:200]}")
        return None, None


def probe_xla(ev: Evaluator, size: int):
    """Does ``size`` fit with tflms-xla? A size the plain XLA step fits is left alone (XLA alone first)."""
    from .search import Probe
    if ev.fits("none", size):
        return Probe(True, ev.cache[("none", size)].sim)
    graph, _ = ev.steps.graph(ev.model, "plain", size)
    result, _ = tune_xla(graph, ev, first_fit=True)
    if result is None:
        return Probe(False)
    return Probe(True, result.best.sim, len(result.graph))


def _sim(ev: Evaluator, method: str, size: int):
    """``method``'s simulated step at ``size`` (``none``, a traced one), from the evaluator's cache: probed once."""
    ev.fits(method, size)
    return ev.cache[(method, size)].sim


def _full(ev: Evaluator, size: int) -> dict[str, Any] | None:
    """tflms-xla's full tune at ``size``: the step and peak of the plan the pipeline runs (module doc; ``guarantee``:
    how it is held), and the plain XLA step there on a GPU with unlimited memory."""
    from tflms.pipeline.held import hold_tuned
    graph, _ = ev.steps.graph(ev.model, "plain", size)
    plain = _sim(ev, "none", size)
    t0 = time.perf_counter()
    result, chosen = tune_xla(graph, ev, first_fit=False)
    took = time.perf_counter() - t0
    if result is None:
        say(f"{ev.model} {ev.profile.name} {METHOD}: the full tune at batch {size} finds no fit [{took:.0f} s]")
        return None
    say(f"{ev.model} {ev.profile.name} {METHOD}: full tune at batch {size} in {took:.0f} s: {result.best.strategy} "
        f"{result.best.params}, step {1e3 * result.best.sim.step_time_s:.1f} ms against plain XLA "
        f"{1e3 * plain.step_time_s:.1f} ms")
    # what the pipeline runs: the winner held to the budget in TensorFlow's executor, or the next fit that can be
    # (tflms.pipeline.held; pinning an order cuts XLA clusters, so a winner close to its budget may not be held)
    t0 = time.perf_counter()
    runs, order = hold_tuned(result, ev.profile, chosen)
    held_s = time.perf_counter() - t0
    sim = runs.best.sim
    out = {"batch": size, "step_s": sim.step_time_s, "plain_xla_step_s": plain.step_time_s,
           "overhead": sim.step_time_s / plain.step_time_s - 1.0, "samples_per_s": size / sim.step_time_s,
           "peak_with_margin_bytes": sim.peak_with_margin_bytes, "kernels": sim.kernels, "clock": sim.clock,
           "strategy": runs.best.strategy, "params": {k: str(v) for k, v in runs.best.params.items()},
           "land_cuts": chosen.xla_land_cuts, "clones_last": chosen.xla_clones_last,
           "tune_s": took, "guarantee": order["guarantee"], "guarantee_why": order["guarantee_why"],
           "hold_s": held_s}
    if runs.best is not result.best:
        out["tuned"] = {"step_s": result.best.sim.step_time_s, "strategy": result.best.strategy,
                        "params": {k: str(v) for k, v in result.best.params.items()},
                        "why": order["held_instead_of"]["why"]}
        say(f"{ev.model} {ev.profile.name} {METHOD}: the tune's winner cannot be held in the executor; the pipeline "
            f"runs {runs.best.strategy} {runs.best.params} instead, step {1e3 * sim.step_time_s:.1f} ms")
    return out


def cut_bounds(ev: Evaluator, size: int) -> dict[str, Any]:
    """The cut bound (:mod:`tflms.tune.cut_bound`) at ``size``: the least overhead against the plain XLA step of any plan
    that fits (``any``) and of any recompute-only plan (``recompute``), simulated, a lower bound (docs/design.md, "The
    cut bound"); ``None`` where none fits. Beside each, its search's status (which rule stopped it: the gap, the node
    limit, or the safety net's time limit, whose figure is not repeatable), its nodes and its seconds."""
    from tflms.analysis.cto import analyze_graph
    from tflms.tune.cut_bound import cut_bound
    graph, _ = ev.steps.graph(ev.model, "plain", size)
    plain = _sim(ev, "none", size)
    analysis = analyze_graph(graph)
    out: dict[str, Any] = {"batch": size, "simulated": True}
    for key, swaps in (("recompute", False), ("any", True)):
        t0 = time.perf_counter()
        bound = cut_bound(analysis, plain, ev.profile, ev.budget, margin_fraction=ev.options.margin_fraction,
                          margin_bytes=ev.options.margin_bytes, swaps=swaps)
        out[key] = None if not bound.fits else bound.overhead
        out[f"{key}_status"] = bound.status
        out[f"{key}_nodes"] = bound.nodes
        out[f"{key}_s"] = time.perf_counter() - t0
    say(f"{ev.model} {ev.profile.name}: cut bound at batch {size}: recompute only "
        f"{_pct(out['recompute'])}, any plan {_pct(out['any'])}")
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def _evaluator(steps, model: str, profile_name: str, budget: int | None, bisect_steps: int | None,
               headroom: float) -> Evaluator:
    """The bench's evaluator of ``model`` on a profile, on the ``xla`` clock (``none`` and checkpointing)."""
    from tflms.sim import SimOptions, get_profile
    from tflms.sim.clock import CLOCK_XLA
    profile = get_profile(profile_name)
    return Evaluator(steps, model, profile, budget_for(model, profile, budget), exact=bisect_steps is None,
                     options=SimOptions(margin_fraction=headroom, clock=CLOCK_XLA))


def run_xla_at(steps, model: str, profile_name: str, size: int, budget: int | None,
               headroom: float = HEADROOM) -> dict[str, Any]:
    """``bench.py --xla-targets --at MODEL=SIZE``: no search; at ``size``, tflms-xla's full tune (``None`` where nothing
    fits) and checkpointing's step under XLA, each against the plain XLA step there."""
    ev = _evaluator(steps, model, profile_name, budget, None, headroom)
    ckpt = _sim(ev, "checkpoint-segments", size)
    plain_s = _sim(ev, "none", size).step_time_s
    return {"model": model, "profile": profile_name, "budget_bytes": ev.budget, "headroom": headroom, "batch": size,
            "cut_bound": cut_bounds(ev, size), "checkpoint": {"step_s": ckpt.step_time_s, "overhead": ckpt.step_time_s / plain_s - 1.0,
                           "fits": ckpt.peak_with_margin_bytes <= ev.budget},
            METHOD: _full(ev, size), "simulated": True}


def run_xla_targets(steps, model: str, profile_name: str, budget: int | None, bisect_steps: int | None,
                    headroom: float = HEADROOM) -> dict[str, Any]:
    """One model on one profile: the three maxima, tflms-xla's full tunes, and the targets (module doc)."""
    ev = _evaluator(steps, model, profile_name, budget, bisect_steps, headroom)
    budget_bytes = ev.budget
    t0 = time.perf_counter()
    maxima = {}
    none_max, none_up = search_max(lambda s: ev.fits("none", s), 1, bisect_steps)
    maxima["none"] = none_max
    ckpt_max, ckpt_up = search_max(lambda s: ev.fits("checkpoint-segments", s), none_max, bisect_steps, none_up)
    maxima["checkpoint-segments"] = ckpt_max
    ev.cache.update({(METHOD, s): p for (m, s), p in ev.cache.items() if m == "none" and p.fits})
    xla_max, xla_up = search_max(lambda s: _fits_xla(ev, s), max(ckpt_max, none_max), bisect_steps, ckpt_up)
    maxima[METHOD] = xla_max
    say(f"{model} {profile_name}: maxima none {none_max}, checkpoint-segments {ckpt_max}, {METHOD} {xla_max}")
    record: dict[str, Any] = {"model": model, "profile": profile_name, "budget_bytes": budget_bytes,
                              "headroom": headroom, "maxima": maxima,
                              "upper": {"none": none_up, "checkpoint-segments": ckpt_up, METHOD: xla_up},
                              "simulated": True}
    none_sim = ev.cache[("none", none_max)].sim
    record["none_at_max"] = {"step_s": none_sim.step_time_s, "samples_per_s": none_max / none_sim.step_time_s}
    # target 1, at checkpointing's maximum
    ckpt = _sim(ev, "checkpoint-segments", ckpt_max)
    plain_s = _sim(ev, "none", ckpt_max).step_time_s
    record["checkpoint_at_its_max"] = {"batch": ckpt_max, "step_s": ckpt.step_time_s,
                                       "overhead": ckpt.step_time_s / plain_s - 1.0,
                                       "samples_per_s": ckpt_max / ckpt.step_time_s}
    at_ckpt = _full(ev, ckpt_max) if ckpt_max > none_max else {
        "batch": ckpt_max, "overhead": 0.0, "step_s": plain_s, "plain_xla_step_s": plain_s,
        "samples_per_s": ckpt_max / plain_s, "strategy": "none"}
    record["tflms_xla_at_checkpoint_max"] = at_ckpt
    record["cut_bound_at_checkpoint_max"] = cut_bounds(ev, ckpt_max)
    # target 2, at tflms-xla's maximum
    record["tflms_xla_at_its_max"] = _full(ev, xla_max) if xla_max > none_max else (
        at_ckpt if xla_max == ckpt_max else None)
    record["targets"] = targets(record)
    if record["targets"]["throughput_half_of_plain_xla"]["met"] is False:
        record["throughput_met_max"] = throughput_met_max(ev, record)
    record["wall_s"] = time.perf_counter() - t0
    return record


def throughput_met_max(ev: Evaluator, record: dict[str, Any], bisections: int = THROUGHPUT_BISECTIONS,
                       full=None) -> dict[str, Any]:
    """Where target 2 fails at tflms-xla's maximum, the nearest target met (issue 47: "give the nearest target that
    can be"): the largest batch found at which tflms-xla's full tune keeps the target's samples/s, a search from
    checkpointing's maximum (halving below it where it fails there too) towards tflms-xla's maximum, ``bisections``
    halvings of the gap (:func:`~benchlib.search.search_max`), each probe a full tune (``full``: :func:`_full`).
    Samples/s need not fall with the batch, so the batch found holds and the one above it (``upper``) does not; the
    batches between were not all tried."""
    full = full or (lambda size: _full(ev, size))
    limit = record["targets"]["throughput_half_of_plain_xla"]["limit"]
    maxima = record["maxima"]
    tried: dict[int, dict[str, Any] | None] = {maxima[METHOD]: record["tflms_xla_at_its_max"]}
    if record["tflms_xla_at_checkpoint_max"] is not None:
        tried[maxima["checkpoint-segments"]] = record["tflms_xla_at_checkpoint_max"]

    def holds(size: int) -> bool:
        if size not in tried:
            tried[size] = full(size)
        at = tried[size]
        return at is not None and at["samples_per_s"] >= limit
    start = max(maxima["checkpoint-segments"], maxima["none"])
    found, upper = search_max(holds, start, bisections, maxima[METHOD])
    at = tried.get(found)
    say(f"{ev.model} {ev.profile.name} {METHOD}: target 2 holds up to batch {found} (not at {upper})")
    return {"batch": found, "upper": upper, "limit": limit, "bisections": bisections,
            "samples_per_s": None if at is None else at["samples_per_s"],
            "ratio": None if at is None else at["samples_per_s"] / record["none_at_max"]["samples_per_s"],
            "at": at, "tried": {str(k): (None if v is None else v["samples_per_s"]) for k, v in sorted(tried.items())}}


def _fits_xla(ev: Evaluator, size: int) -> bool:
    key = (METHOD, size)
    if key not in ev.cache:
        t0 = time.perf_counter()
        probe = probe_xla(ev, size)
        probe.seconds = time.perf_counter() - t0
        ev.cache[key] = probe
        say(f"{ev.model} {ev.profile.name} {METHOD}: batch {size} {'fits' if probe.fits else 'does not fit'} "
            f"[{probe.seconds:.1f} s]")
    return ev.cache[key].fits


def targets(record: dict[str, Any]) -> dict[str, Any]:
    """Issue 47's two simulated targets for one record (``met``: ``None`` where a figure is missing)."""
    ckpt, at_ckpt = record["checkpoint_at_its_max"], record["tflms_xla_at_checkpoint_max"]
    first = None
    if at_ckpt is not None and ckpt["overhead"] > 0:
        first = at_ckpt["overhead"] <= OVERHEAD_FRACTION * ckpt["overhead"]
    at_max, none = record["tflms_xla_at_its_max"], record["none_at_max"]
    second = None if at_max is None else at_max["samples_per_s"] >= THROUGHPUT_FRACTION * none["samples_per_s"]
    return {"overhead_half_of_checkpointing": {
                "met": first, "tflms_xla": None if at_ckpt is None else at_ckpt["overhead"],
                "checkpoint": ckpt["overhead"], "limit": OVERHEAD_FRACTION * ckpt["overhead"]},
            "throughput_half_of_plain_xla": {
                "met": second, "tflms_xla": None if at_max is None else at_max["samples_per_s"],
                "plain_xla": none["samples_per_s"], "limit": THROUGHPUT_FRACTION * none["samples_per_s"]}}


def markdown(records: list[dict[str, Any]], command: str) -> list[str]:
    """The report's tables: the maxima, and each target per model and profile."""
    pct = _pct

    def verdict(t):
        return {True: "met", False: "**not met**", None: "-"}[t["met"]]
    lines = ["Produced by", "", f"    {command}", "",
             "Every figure is **simulated** by tflms's simulator (nothing ran on a GPU). `none` and "
             "`checkpoint-segments` on the `xla` clock (the step XLA compiles whole); `tflms-xla` on the `xla-clusters` "
             "clock (its XLA clusters between tflms's copies, issue 47).", "",
             "| model | profile | none max | checkpoint-segments max | tflms-xla max (x none) |", "|---|---|---|---|---|"]
    for r in records:
        m = r["maxima"]
        lines.append(f"| {r['model']} | {r['profile']} | {m['none']} | {m['checkpoint-segments']} | "
                     f"{m[METHOD]} ({m[METHOD] / max(1, m['none']):.2f}x) |")
    lines += ["", "Target 1: at checkpointing's maximum, tflms-xla's overhead against the plain XLA step at most half of "
              "checkpointing's.", "",
              "Bound: the cut bound (`tflms.tune.cut_bound`), the least overhead of any recompute-only plan / any plan "
              "that fits, a simulated lower bound (\"-\": not computed in that run).", "",
              "| model | profile | batch | checkpoint-segments | tflms-xla | limit | bound (recompute / any) | "
              "tflms-xla's choice | target |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        t, a = r["targets"]["overhead_half_of_checkpointing"], r["tflms_xla_at_checkpoint_max"] or {}
        b = r.get("cut_bound_at_checkpoint_max") or {}
        lines.append(f"| {r['model']} | {r['profile']} | {r['checkpoint_at_its_max']['batch']} | "
                     f"{pct(t['checkpoint'])} | {pct(t['tflms_xla'])} | {pct(t['limit'])} | "
                     f"{pct(b.get('recompute'))} / {pct(b.get('any'))} | "
                     f"{a.get('strategy', '-')} {a.get('params', '')} | {verdict(t)} |")
    lines += ["", "Target 2: at tflms-xla's maximum, samples/s at least 0.5x the plain XLA step's at its own maximum.",
              "", "| model | profile | plain XLA max | its samples/s | tflms-xla max | its samples/s | ratio | target |",
              "|---|---|---|---|---|---|---|---|"]
    for r in records:
        t = r["targets"]["throughput_half_of_plain_xla"]
        ratio = None if t["tflms_xla"] is None else t["tflms_xla"] / t["plain_xla"]
        got = "-" if t["tflms_xla"] is None else f"{t['tflms_xla']:.1f}"
        lines.append(f"| {r['model']} | {r['profile']} | {r['maxima']['none']} | {t['plain_xla']:.1f} | "
                     f"{r['maxima'][METHOD]} | {got} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} | {verdict(t)} |")
    nearest = [r for r in records if r.get("throughput_met_max")]
    if nearest:
        lines += ["", "Where target 2 is missed, the nearest target met: the largest batch found at which tflms-xla "
                  "keeps 0.5x (a search from checkpointing's maximum towards tflms-xla's, each probe a full tune; "
                  "samples/s need not fall with the batch, so batches between the two were not all tried).", "",
                  "| model | profile | batch | its samples/s | ratio | its choice | not at |",
                  "|---|---|---|---|---|---|---|"]
        for r in nearest:
            n, at = r["throughput_met_max"], r["throughput_met_max"]["at"] or {}
            got = "-" if n["samples_per_s"] is None else f"{n['samples_per_s']:.1f}"
            ratio = "-" if n["ratio"] is None else f"{n['ratio']:.2f}"
            lines.append(f"| {r['model']} | {r['profile']} | {n['batch']} | {got} | {ratio} | "
                         f"{at.get('strategy', '-')} {at.get('params', '')} | {n['upper']} |")
    return lines
