"""vDNN's headline result, like for like (see tools/vdnn_like_for_like.py): the computation."""

from __future__ import annotations

from .common import HEADROOM, say

#: vDNN's VGG-16 step: 28 GB on a 12 GB card.
PAPER_OVERSUBSCRIPTION = 28 / 12
PAPER_LOSS = 0.18
#: label -> (tuner strategies, enforce the order)
METHODS = {"vdnn_conv": (["vdnn_conv"], False), "vdnn_all": (["vdnn_all"], False),
           "tflms-best": (["tflms-distance", "idle-time", "idle-time-no-overhead"], True)}


def batch_at(steps, profile, ratio: float, options) -> tuple[int, int]:
    """The largest batch whose simulated no-swap peak is at most ``ratio`` x the profile's memory."""
    from tflms.sim import simulate
    target = ratio * profile.memory_bytes

    def peak(b: int) -> int:
        return simulate(steps.graph("vgg16", "plain", b)[0], profile, options=options).peak_bytes

    lo, hi = 1, 2
    while peak(hi) <= target:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if peak(mid) <= target else (lo, mid)
    return lo, peak(lo)


def like_for_like(steps, profile_name: str, oversubscription: float = PAPER_OVERSUBSCRIPTION,
                  headroom: float = HEADROOM) -> dict:
    """VGG-16 at ``oversubscription`` x the profile's memory: each method's fit, step and loss (simulated)."""
    from tflms.errors import BudgetError
    from tflms.profiles import get_profile
    from tflms.sim import SimOptions, simulate
    from tflms.sim.bounds import swap_only_bound
    from tflms.tune.tuner import tune

    profile = get_profile(profile_name)
    options = SimOptions(margin_fraction=headroom)
    batch, plain_peak = batch_at(steps, profile, oversubscription, SimOptions())
    say(f"VGG-16 batch {batch}: no-swap peak {plain_peak / 2**30:.1f} GiB "
        f"({plain_peak / profile.memory_bytes:.2f}x {profile.name}'s memory)")
    graph = steps.graph("vgg16", "plain", batch)[0]
    enough = simulate(graph, profile, options=options)
    rows = [{"method": "enough memory", "fits": True, "peak_gib": enough.peak_with_margin_bytes / 2**30,
             "step_ms": enough.step_time_s * 1e3, "loss": 0.0}]
    bound = swap_only_bound(graph, options).bound_bytes * (1 + headroom)
    rows.append({"method": "swap-only bound", "fits": bound <= profile.memory_bytes, "peak_gib": bound / 2**30,
                 "step_ms": None, "loss": None})

    def run(label: str, b: int) -> dict:
        strategies, order = METHODS[label]
        g = steps.graph("vgg16", "plain", b)[0]
        plain = simulate(g, profile, options=options)
        try:
            sim = tune(g, budget=profile.memory_bytes, profile=profile, strategies=strategies,
                       sim_options=options, enforce_order=order).best.sim
            fits = True
        except BudgetError as error:
            sim = min(error.candidates, key=lambda c: c.sim.peak_with_margin_bytes).sim
            fits = False
        return {"method": label, "batch": b, "fits": fits, "peak_gib": sim.peak_with_margin_bytes / 2**30,
                "step_ms": sim.step_time_s * 1e3, "loss": sim.step_time_s / plain.step_time_s - 1 if fits else None,
                "oversubscription": plain.peak_bytes / profile.memory_bytes}

    largest = []
    for label in METHODS:
        row = run(label, batch)
        rows.append(row)
        if not row["fits"]:  # the largest batch it fits, by bisection (fits is monotone in the batch here)
            lo, hi = 1, batch
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if run(label, mid)["fits"] else (lo, mid)
            largest.append(run(label, lo))
            say(f"{label}: fits up to batch {lo}")
    return {"profile": profile.name, "batch": batch, "no_swap_peak_gib": plain_peak / 2**30,
            "oversubscription": plain_peak / profile.memory_bytes,
            "paper": {"batch": 256, "oversubscription": PAPER_OVERSUBSCRIPTION, "loss": PAPER_LOSS},
            "rows": rows, "largest_fitting": largest}


def like_for_like_markdown(out: dict) -> list[str]:
    lines = [f"VGG-16 at {out['oversubscription']:.2f}x over-subscription on {out['profile']} (batch {out['batch']}, "
             f"no-swap peak {out['no_swap_peak_gib']:.1f} GiB), simulated; vDNN reported 18% loss at 2.33x on a "
             "Titan X (measured).", "", "| method | fits | peak (with headroom) | step ms | loss vs enough memory |",
             "|---|---|---|---|---|"]
    for r in out["rows"]:
        loss = "-" if r["loss"] is None else f"{100 * r['loss']:+.1f}%"
        step = "-" if r["step_ms"] is None else f"{r['step_ms']:.0f}"
        lines.append(f"| {r['method']} | {'yes' if r['fits'] else 'no'} | {r['peak_gib']:.2f} GiB | {step} | {loss} |")
    if out["largest_fitting"]:
        lines += ["", "Where a method does not fit there: its largest batch, the over-subscription of that batch's "
                  "no-swap step, and its loss there.", "",
                  "| method | largest batch | over-subscription | step ms | loss vs enough memory |",
                  "|---|---|---|---|---|"]
        for r in out["largest_fitting"]:
            lines.append(f"| {r['method']} | {r['batch']} | {r['oversubscription']:.2f}x | {r['step_ms']:.0f} | "
                         f"{100 * r['loss']:+.1f}% |")
    return lines
