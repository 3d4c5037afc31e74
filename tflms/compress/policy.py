"""Which swapped tensors to compress, and with which codec (CSwap+'s per-tensor rule).

For each tensor of a swap plan, :func:`decide_compression` compares its plain
round trip (one swap-out plus one swap-in per consumer group, each a host copy
on the profile's link, :meth:`~tflms.profiles.HardwareProfile.copy_time_s`)
with the compressed one: encode once, copy every part out and back in (each part
is its own copy and pays the link latency), decode once per group. Encode and
decode run on the accelerator's compute stream (:func:`tflms.sim.cost.codec_time_s`:
calibrated throughputs, else the roofline of the codec's kernels), so they always
cost step time, while a shorter copy only helps if the copy was *exposed*.

Exposure comes from simulating the uncompressed rewrite (``tflms.sim.simulate``):

- ``waited``: a consumer of the swap-in (or a ``sync_mode`` consumer of the
  swap-out) started exactly when the copy ended, after the compute stream had
  been idle: the idle time is the exposed time;
- ``contended``: one of the tensor's copies waited for its stream (other copies
  ahead of it) while the step stalled somewhere: the copy stream is the
  bottleneck, and the whole stall time bounds what shrinking this copy can win;
- ``hidden``: neither; the copies overlap compute, compressing can only cost.

A codec is *faster* when ``encode + decodes + compressed copies < plain copies``.
The tensor is compressed with the codec of the largest
``gain = min(exposed, plain copies - compressed copies) - (encode + decodes)`` if
that codec is faster, the copy is exposed, and ``gain > min_gain_s``. Sizes come
from measured sparsity (:mod:`tflms.compress.profiling`): a tensor that was not
profiled is never compressed (compressibility is measured, not guessed), and a
lossy codec is refused for a tensor whose measured values exceed its range. Lossy
codecs are only considered with ``allow_lossy=True``; naming one without it
raises :class:`~tflms.errors.ConfigError`.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tflms.compress.codecs import CODEC_NAMES, Codec, get_codec, require_lossless_allowed
from tflms.compress.profiling import ProfileReport, TensorStats
from tflms.compress.rewrite import CompressionChoice
from tflms.ir.graph import DTYPE_BYTES, Graph, TensorRef
from tflms.policies.swapplan import SwapDecision, SwapPlan
from tflms.sim.cost import DECODE, ENCODE, codec_time_s
from tflms.profiles import HardwareProfile, get_profile
from tflms.sim.simulator import RECV_SUFFIX, SimOptions, SimResult, simulate

logger = logging.getLogger(__name__)

#: Two simulated instants closer than this count as the same (seconds).
TIME_EPSILON_S = 1e-12
WAITED, CONTENDED, HIDDEN = "waited", "contended", "hidden"
#: Simulations the verification of one decision may run (one per tensor the cost model picks).
MAX_VERIFY_SIMULATIONS = 64


@dataclasses.dataclass(frozen=True)
class CodecEstimate:
    """The cost model's figures for one codec on one tensor (times in seconds, per step)."""

    codec: str  # cost key, e.g. "zvc" or "fp16"
    compressed_bytes: int
    encode_s: float
    decode_s: float  # one decode (there is one per swap-in group)
    transfer_s: float  # compressed copies: every part out once and in once per group
    codec_s: float  # encode + every decode
    saved_transfer_s: float  # plain copies - compressed copies
    gain_s: float  # min(exposed, saved_transfer_s) - codec_s
    faster: bool  # codec_s + transfer_s < plain copies
    refused: str = ""  # why this codec may not be used here
    uncompressed_bytes: int = 0

    @property
    def ratio(self) -> float:
        return 0.0 if not self.compressed_bytes else self.uncompressed_bytes / self.compressed_bytes


@dataclasses.dataclass(frozen=True)
class CompressionDecision:
    """What the policy decided for one swapped tensor, and the figures it used."""

    tensor: TensorRef
    num_bytes: int
    groups: int
    stats: TensorStats | None
    plain_transfer_s: float
    exposed_s: float
    exposure: str  # waited / contended / hidden
    estimates: tuple[CodecEstimate, ...]
    codec: str | None  # cost key of the chosen codec, None for a plain swap
    reason: str

    @property
    def chosen(self) -> CodecEstimate | None:
        return next((e for e in self.estimates if e.codec == self.codec), None)


@dataclasses.dataclass(frozen=True)
class CompressionPolicyResult:
    """Per-tensor decisions, the resulting choices for ``apply_compression``, and a report."""

    profile: str
    throughputs: str  # where codec speeds came from
    allow_lossy: bool
    decisions: tuple[CompressionDecision, ...]
    choices: tuple[CompressionChoice, ...]
    plain_step_time_s: float | None = None  # simulated, uncompressed rewrite
    compressed_step_time_s: float | None = None  # simulated with ``choices`` (when verified)
    simulations: int = 0  # verification simulations run

    @property
    def compressed(self) -> tuple[CompressionDecision, ...]:
        return tuple(d for d in self.decisions if d.codec is not None)

    def predicted_transfer_s(self) -> tuple[float, float]:
        """Copy time of every swap, plain and with the chosen codecs (one step)."""
        plain = sum(d.plain_transfer_s for d in self.decisions)
        chosen = sum(d.chosen.transfer_s if d.chosen else d.plain_transfer_s for d in self.decisions)
        return plain, chosen

    def table(self) -> str:
        lines = [f"compression on {self.profile} (codec speeds: {self.throughputs}; lossy "
                 f"{'allowed' if self.allow_lossy else 'not allowed'})",
                 f"{'tensor':<52}{'MiB':>8}{'sparsity':>9}{'exposed us':>11}{'plain us':>10}{'codec':>12}"
                 f"{'ratio':>7}{'gain us':>9}  reason"]
        for d in self.decisions:
            est = d.chosen or (max(d.estimates, key=lambda e: e.gain_s) if d.estimates else None)
            sparsity = "" if d.stats is None else f"{d.stats.sparsity:.3f}"
            lines.append(f"{d.tensor.name[-51:]:<52}{d.num_bytes / 2**20:>8.2f}{sparsity:>9}"
                         f"{d.exposed_s * 1e6:>11.1f}{d.plain_transfer_s * 1e6:>10.1f}"
                         f"{(d.codec or '-'):>12}{(f'{est.ratio:.2f}' if est else ''):>7}"
                         f"{(f'{est.gain_s * 1e6:.1f}' if est else ''):>9}  {d.reason}")
        plain, chosen = self.predicted_transfer_s()
        lines.append(f"{len(self.compressed)} of {len(self.decisions)} swapped tensors compressed; copy time "
                     f"{plain * 1e3:.3f} ms -> {chosen * 1e3:.3f} ms per step"
                     + (f"; simulated step {self.plain_step_time_s * 1e3:.3f} -> "
                        f"{self.compressed_step_time_s * 1e3:.3f} ms ({self.simulations} simulations)"
                        if self.compressed_step_time_s is not None else ""))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        plain, chosen = self.predicted_transfer_s()
        return {
            "profile": self.profile, "throughputs": self.throughputs, "allow_lossy": self.allow_lossy,
            "compressed": len(self.compressed), "transfer_s_plain": plain, "transfer_s_compressed": chosen,
            "step_time_s_plain": self.plain_step_time_s, "step_time_s_compressed": self.compressed_step_time_s,
            "simulations": self.simulations,
            "tensors": [{
                "tensor": d.tensor.name, "bytes": d.num_bytes, "groups": d.groups, "codec": d.codec,
                "reason": d.reason, "exposure": d.exposure, "exposed_s": d.exposed_s,
                "plain_transfer_s": d.plain_transfer_s,
                "measured": None if d.stats is None else d.stats.to_dict(),
                "estimates": [dataclasses.asdict(e) | {"ratio": e.ratio} for e in d.estimates],
            } for d in self.decisions]}


# ------------------------------------------------------------------ exposure
class _Timeline:
    """Lookups into one simulation: records by name and the ends of busy compute-stream intervals."""

    def __init__(self, sim: SimResult):
        self.sim = sim
        self.records = {r.name: r for r in sim.ops}
        # Ops that take no time do not occupy the stream: only kernels with a duration end a busy interval.
        self.compute_ends = sorted(r.end_s for r in sim.ops if r.stream == "compute" and r.end_s > r.start_s)

    def idle_before(self, start_s: float) -> float:
        """How long the compute stream had been idle when an op started at ``start_s``."""
        i = bisect.bisect_right(self.compute_ends, start_s + TIME_EPSILON_S)
        previous = self.compute_ends[i - 1] if i else 0.0
        return max(0.0, start_s - previous)


def _h2d_copy(graph: Graph, name: str, host_device: str) -> str:
    """Name of the host-to-accelerator copy of swap-in ``name`` in the simulation."""
    device = graph.op(name).device
    on_host = device and device.rpartition("/device:")[2] == host_device.rpartition("/device:")[2]
    return name + RECV_SUFFIX if on_host else name


def swap_exposure(graph: Graph, swap: SwapDecision, timeline: _Timeline, host_device: str) -> tuple[float, str]:
    """``(exposed seconds, kind)`` of one swap's copies in the simulated uncompressed step (see module doc)."""
    records = timeline.records
    waited = 0.0
    waits: list[tuple[str, list[str]]] = [(swap.swap_out, list(swap.sync_out_consumers))]
    waits += [(_h2d_copy(graph, g.name, host_device), list(g.consumers)) for g in swap.swap_ins]
    contended = False
    for copy, consumers in waits:
        rec = records.get(copy)
        if rec is None:
            continue
        ready = max((records[p].end_s for p in _sim_predecessors(graph, copy, swap) if p in records), default=0.0)
        if rec.start_s > ready + TIME_EPSILON_S:
            contended = True
        for consumer in sorted((records[c] for c in consumers if c in records), key=lambda r: r.start_s)[:1]:
            if abs(consumer.start_s - rec.end_s) <= TIME_EPSILON_S:
                waited += timeline.idle_before(consumer.start_s)
    if waited > 0:
        return waited, WAITED
    if contended and timeline.sim.stall_time_s > 0:
        return timeline.sim.stall_time_s, CONTENDED
    return 0.0, HIDDEN


def _sim_predecessors(graph: Graph, copy: str, swap: SwapDecision) -> list[str]:
    if copy.endswith(RECV_SUFFIX):
        return [copy[: -len(RECV_SUFFIX)]]
    if copy == swap.swap_out:
        return [swap.tensor.op]
    return graph.predecessors(copy)


# ------------------------------------------------------------------ the decision
def _candidate_codecs(codecs: Sequence[Codec | str] | None, allow_lossy: bool) -> list[Codec]:
    if codecs is None:
        objs = [get_codec(n) for n in CODEC_NAMES]
        return [c for c in objs if c.lossless or allow_lossy]
    objs = [get_codec(c) if isinstance(c, str) else c for c in codecs]
    for codec in objs:
        require_lossless_allowed(codec, allow_lossy)
    return objs


def estimate(codec: Codec, swap: SwapDecision, stats: TensorStats, profile: HardwareProfile, exposed_s: float,
             throughputs: Any = None) -> CodecEstimate:
    """The cost model's figures for compressing ``swap``'s tensor with ``codec``."""
    groups = len(swap.swap_ins)
    num_bytes = swap.num_bytes
    plain = profile.copy_time_s(num_bytes) * (1 + groups)
    refused = ""
    try:
        codec.check_dtype(swap.dtype)
    except Exception as err:  # CodecDtypeError
        refused = f"dtype {swap.dtype} unsupported"
        del err
    if refused:
        return CodecEstimate(codec.cost_key, num_bytes, 0.0, 0.0, plain, 0.0, 0.0, -1.0, False, refused, num_bytes)
    num_elements = num_bytes // DTYPE_BYTES[swap.dtype]
    parts = codec.part_bytes(num_elements, swap.dtype, stats.nonzero_fraction)
    copies = sum(profile.copy_time_s(p) for p in parts)
    transfer = copies * (1 + groups)
    encode_s = codec_time_s(codec.cost_key, ENCODE, num_bytes, profile, throughputs)
    decode_s = codec_time_s(codec.cost_key, DECODE, num_bytes, profile, throughputs)
    codec_s = encode_s + groups * decode_s
    saved = plain - transfer
    gain = min(exposed_s, saved) - codec_s
    if not codec.lossless:
        beyond = stats.out_of_range_fraction(codec)
        if beyond > 0:
            refused = f"{100 * beyond:.3g}% of the values exceed its range"
    return CodecEstimate(codec.cost_key, sum(parts), encode_s, decode_s, transfer, codec_s, saved, gain,
                         codec_s + transfer < plain, refused, num_bytes)


def decide_compression(graph: Graph, plan: SwapPlan, stats: ProfileReport | Mapping[str, TensorStats],
                       profile: str | HardwareProfile, *, codecs: Sequence[Codec | str] | None = None,
                       allow_lossy: bool = False, throughputs: Any = None, sim: SimResult | None = None,
                       sim_options: SimOptions | None = None, min_gain_s: float = 0.0, verify: bool = True,
                       max_simulations: int = MAX_VERIFY_SIMULATIONS,
                       budget_bytes: int | None = None) -> CompressionPolicyResult:
    """Decide per swapped tensor whether and how to compress (see the module doc).

    ``graph``: the uncompressed rewrite (``apply_swaps(…, plan).graph``); ``stats``:
    measured figures by tensor name; ``codecs``: candidates (default: the
    lossless ones, and the lossy ones too with ``allow_lossy``); ``throughputs``:
    calibrated codec speeds (default: the profile's, else its roofline);
    ``sim``: the simulation of ``graph`` on ``profile`` if already run.

    With ``verify`` the tensors the cost model picks are added one at a time,
    largest estimated gain first, and each is kept only if simulating the
    compressed step makes it faster (and keeps the peak within ``budget_bytes``
    when given); at most ``max_simulations`` simulations are run, and picks
    left unverified are not compressed.
    """
    profile = get_profile(profile)
    candidates = _candidate_codecs(codecs, allow_lossy)
    stats_by_name = dict(stats.stats if isinstance(stats, ProfileReport) else stats)
    options = sim_options or SimOptions(host_device=plan.config.host_device)
    sim_profile = profile
    if throughputs is not None and getattr(profile, "codec_throughputs", None) is None:
        from tflms.compress.calibrate import with_throughputs
        sim_profile = with_throughputs(profile, throughputs)
    sim = sim if sim is not None else simulate(graph, sim_profile, options=options)
    timeline = _Timeline(sim)
    source = getattr(throughputs, "device", None) or getattr(getattr(profile, "codec_throughputs", None), "device",
                                                              None) or f"{profile.name} roofline (assumed)"
    decisions: dict[TensorRef, CompressionDecision] = {}
    picks: list[tuple[CompressionChoice, CodecEstimate]] = []
    for swap in plan.swaps:
        exposed, kind = swap_exposure(graph, swap, timeline, options.host_device)
        plain = profile.copy_time_s(swap.num_bytes) * (1 + len(swap.swap_ins))
        measured = stats_by_name.get(swap.tensor.name)
        if measured is None:
            decisions[swap.tensor] = CompressionDecision(
                swap.tensor, swap.num_bytes, len(swap.swap_ins), None, plain, exposed, kind, (), None,
                "not profiled: compressibility unknown")
            continue
        estimates = tuple(estimate(c, swap, measured, profile, exposed, throughputs) for c in candidates)
        usable = [e for e in estimates if not e.refused and e.faster]
        best = max(usable, key=lambda e: e.gain_s, default=None)  # first of equal gains: the candidates' order
        codec = None
        if best is None:
            reason = "; ".join(f"{e.codec}: {e.refused or 'round trip not faster'}" for e in estimates) \
                or "no candidate codec"
        elif kind == HIDDEN:
            reason = "copies hidden behind compute: compressing would only add codec time"
        elif best.gain_s <= min_gain_s:
            reason = (f"{best.codec} saves {best.saved_transfer_s * 1e6:.1f} us of copies but costs "
                      f"{best.codec_s * 1e6:.1f} us of compute for {exposed * 1e6:.1f} us exposed")
        else:
            codec = best.codec
            reason = f"{kind}: {best.codec} saves {best.gain_s * 1e6:.1f} us (ratio {best.ratio:.2f})"
            chosen_codec = next(c for c in candidates if c.cost_key == best.codec)
            picks.append((CompressionChoice(swap.tensor, chosen_codec, measured.nonzero_fraction), best))
        decisions[swap.tensor] = CompressionDecision(swap.tensor, swap.num_bytes, len(swap.swap_ins), measured, plain,
                                                     exposed, kind, estimates, codec, reason)
    accepted = [choice for choice, _ in picks]
    final_sim, simulations = sim, 0
    if verify and picks:
        accepted, final_sim = [], sim
        for choice, best in sorted(picks, key=lambda p: (-p[1].gain_s, p[0].tensor)):
            decision = decisions[choice.tensor]
            if simulations >= max_simulations:
                decisions[choice.tensor] = dataclasses.replace(
                    decision, codec=None, reason=f"{decision.reason}; not verified (max_simulations="
                                                 f"{max_simulations} used): left plain")
                continue
            simulations += 1
            _, trial = simulate_compressed(graph, plan, accepted + [choice], sim_profile, allow_lossy=allow_lossy,
                                           sim_options=options)
            delta = trial.step_time_s - final_sim.step_time_s
            over = budget_bytes is not None and trial.peak_with_margin_bytes > budget_bytes
            if delta < -TIME_EPSILON_S and not over:
                accepted.append(choice)
                final_sim = trial
                decisions[choice.tensor] = dataclasses.replace(
                    decision, reason=f"{decision.reason}; simulated step {delta * 1e6:+.1f} us")
            else:
                why = (f"peak {trial.peak_with_margin_bytes} B > budget {budget_bytes} B" if over
                       else f"simulated step {delta * 1e6:+.1f} us")
                decisions[choice.tensor] = dataclasses.replace(
                    decision, codec=None, reason=f"rejected by simulation: {why} (estimated {best.codec} gain "
                                                 f"{best.gain_s * 1e6:.1f} us)")
        order = {s.tensor: i for i, s in enumerate(plan.swaps)}
        accepted.sort(key=lambda c: order[c.tensor])
    return CompressionPolicyResult(profile=profile.name, throughputs=source, allow_lossy=allow_lossy,
                                   decisions=tuple(decisions[s.tensor] for s in plan.swaps), choices=tuple(accepted),
                                   plain_step_time_s=sim.step_time_s,
                                   compressed_step_time_s=final_sim.step_time_s if verify else None,
                                   simulations=simulations)


def simulate_compressed(graph: Graph, plan: SwapPlan, choices: Sequence[CompressionChoice],
                        profile: str | HardwareProfile, *, allow_lossy: bool = False,
                        sim_options: SimOptions | None = None) -> tuple[Graph, SimResult]:
    """Apply ``choices`` to the uncompressed rewrite ``graph`` and simulate it on ``profile``."""
    from tflms.compress.rewrite import apply_compression
    compressed = apply_compression(graph, plan, choices, allow_lossy=allow_lossy).graph
    options = sim_options or SimOptions(host_device=plan.config.host_device)
    return compressed, simulate(compressed, profile, options=options)


def make_compressor(stats: ProfileReport | Mapping[str, TensorStats], profile: str | HardwareProfile, *,
                    allow_lossy: bool = False, codecs: Sequence[Codec | str] | None = None, throughputs: Any = None,
                    sim_options: SimOptions | None = None, verify: bool = True):
    """A ``(graph, plan) -> graph`` step that compresses what :func:`decide_compression` picks.

    For callers that apply many plans (the tuner's evaluator): each uncompressed
    rewrite is decided on and compressed with the same measured ``stats``.
    """
    def compress(graph: Graph, plan: SwapPlan) -> Graph:
        from tflms.compress.rewrite import apply_compression
        if not plan.swaps:
            return graph
        result = decide_compression(graph, plan, stats, profile, codecs=codecs, allow_lossy=allow_lossy,
                                    throughputs=throughputs, sim_options=sim_options, verify=verify)
        return apply_compression(graph, plan, result.choices, allow_lossy=allow_lossy).graph

    return compress
