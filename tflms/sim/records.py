"""The simulator's options and results: :class:`SimOptions`, :class:`OpRecord`, :class:`SimResult`.

The model they describe is in the module doc of :mod:`tflms.sim.simulator`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from tflms.devices import normalize_device
from tflms.errors import ConfigError
from tflms.ir.xla_left_out import check_rules


#: Kernel workspaces of TensorFlow's oneDNN CPU kernels (``SimOptions.workspace_bytes_per_element``):
#: ``_MklNativeMaxPool`` returns a workspace of one byte per output element (the argmax
#: index in the window) that ``MaxPoolGrad`` reads, so it lives as long as the output.
ONEDNN_CPU_WORKSPACES = {"MaxPool": 1.0}
#: ``SimOptions.transfer_order``: copies take their stream in the order the simulator releases them while it
#: walks the execution order ("release", the model so far), or first come first served by the time they became
#: ready ("fifo", what one copy engine per direction does).
TRANSFER_ORDER_RELEASE, TRANSFER_ORDER_FIFO = "release", "fifo"


@dataclasses.dataclass(frozen=True)
class SimOptions:
    """Knobs of the simulator (see module doc)."""

    host_device: str = "/device:CPU:0"
    margin_fraction: float = 0.0
    margin_bytes: int = 0
    model_forwarding: bool = True
    resident_inputs: bool = True
    prune_unused: bool = True
    #: Extra bytes per element of output 0 that kernels of these op types allocate with
    #: that output and keep as long as it (see ``ONEDNN_CPU_WORKSPACES``); ``{type: bytes}``.
    workspace_bytes_per_element: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: How copies queue on each direction's stream (:data:`TRANSFER_ORDER_RELEASE` or :data:`TRANSFER_ORDER_FIFO`,
    #: see the module doc). ``release`` serves a copy released later in the order after an earlier-released one
    #: even when it was ready sooner (a host swap-in whose trigger ran earlier on a parallel branch).
    transfer_order: str = TRANSFER_ORDER_RELEASE
    #: How long each op keeps the accelerator busy and what launching it costs (:mod:`tflms.sim.clock`):
    #: ``"auto"`` (``serial`` on a CPU profile, ``graph`` on a GPU one), ``"serial"``, ``"graph"``, ``"xla"`` or
    #: ``"xla-clusters"`` (the step's XLA clusters between tflms's copies, issue 47).
    clock: str = "auto"
    #: Op types XLA cannot compile for the accelerator (no kernel registered for its XLA device): the
    #: ``xla-clusters`` clock keeps them out of every cluster, as :func:`tflms.passes.xla_clusters.cluster_for_xla`
    #: does (the pipeline fills it from TensorFlow's registry for the step's types).
    xla_unsupported: tuple[str, ...] = ()
    #: Rules (names in :data:`tflms.ir.xla_left_out.RULES`) that pick single ops the ``xla-clusters`` clock keeps out
    #: of every cluster, as :func:`tflms.passes.xla_clusters.cluster_for_xla` does under
    #: :func:`~tflms.passes.xla_clusters.leave_out` (the pipeline fills it from that declaration).
    xla_left_out_rules: tuple[str, ...] = ()
    #: The most clusters one segment's variable updates split into on the ``xla-clusters`` clock, as
    #: :func:`tflms.passes.xla_clusters.cluster_for_xla`'s ``update_parts`` (1: none; the pipeline splits them where
    #: a budget is to be met, :data:`tflms.ir.xla_segments.UPDATE_PARTS`).
    xla_update_parts: int = 1
    #: Whether a reader of a swap-in starts a cluster of its own on the ``xla-clusters`` clock, so that the ops
    #: between the swap-in's trigger and its reader run while the copy lands (``land_cuts`` of
    #: :func:`tflms.passes.xla_clusters.cluster_for_xla`; the tune judges both, :func:`tflms.tune.xla_cuts.tune_xla`).
    xla_land_cuts: bool = False
    #: Whether the segment rule on the ``xla-clusters`` clock orders recompute clones by graph position (last, as they
    #: are appended) instead of where the ops they feed are (``clones_last`` of
    #: :func:`tflms.passes.xla_clusters.cluster_for_xla`; the tune judges both where its winner is a hybrid,
    #: :func:`tflms.tune.xla_cuts.tune_xla`).
    xla_clones_last: bool = False

    def __post_init__(self) -> None:
        from tflms.sim.clock import check_clock  # noqa: PLC0415 - clock imports the simulator's parts
        check_clock(self.clock)
        object.__setattr__(self, "host_device", normalize_device(self.host_device, field="host_device"))
        workspaces = dict(self.workspace_bytes_per_element)
        for op_type, per_element in workspaces.items():
            if not isinstance(per_element, (int, float)) or per_element < 0:
                raise ConfigError(f"workspace_bytes_per_element[{op_type!r}] must be a number >= 0, "
                                  f"got {per_element!r}")
        object.__setattr__(self, "workspace_bytes_per_element", workspaces)
        object.__setattr__(self, "xla_unsupported", tuple(sorted(set(self.xla_unsupported))))
        object.__setattr__(self, "xla_left_out_rules", check_rules(self.xla_left_out_rules))
        if not 0 <= self.margin_fraction < 10:
            raise ConfigError(f"margin_fraction must be in [0, 10), got {self.margin_fraction}")
        if not isinstance(self.xla_update_parts, int) or self.xla_update_parts < 1:
            raise ConfigError(f"xla_update_parts must be an integer >= 1, got {self.xla_update_parts!r}")
        if self.margin_bytes < 0:
            raise ConfigError("margin_bytes must be >= 0")
        if self.transfer_order not in (TRANSFER_ORDER_RELEASE, TRANSFER_ORDER_FIFO):
            raise ConfigError(f"transfer_order must be {TRANSFER_ORDER_RELEASE!r} or {TRANSFER_ORDER_FIFO!r}, "
                              f"got {self.transfer_order!r}")


class OpRecord(NamedTuple):
    """When one op ran, where (a tuple: thousands are made per simulation)."""

    name: str
    device: str
    stream: str  # "compute", "d2h", "h2d" or "host"
    start_s: float
    end_s: float


#: Stream of an op in :attr:`SimDetails.streams` (one byte per op of the order).
STREAMS = ("compute", "host", "h2d", "d2h")


class SimDetails:
    """What one simulation recorded op by op and buffer by buffer, in flat arrays.

    :class:`SimResult`'s ``ops``, ``timeline``, ``buffer_owner``, ``buffer_lifetimes`` and ``live_at_peak`` are views
    of it, built when first read and kept until :meth:`release` (:meth:`SimResult.release_views`). A tune simulates
    hundreds of candidates of a 40,000-op step and reads these views of a few: built eagerly, as tuples of tuples and
    dicts of strings, they took about 300 bytes per op per candidate (docs/design.md, "Tuning memory"). Built by
    :func:`tflms.sim.engine._run`, which owns the arrays it passes.
    """

    __slots__ = ("names", "t_op", "t_idx", "order", "start", "end", "streams", "times", "accel", "host",
                 "buffer_of", "in_order", "lt_buf", "lt_size", "lt_first", "lt_last", "peak_event", "_views")

    def __init__(self, *, names: Sequence[str], t_op: Sequence[int], t_idx: Sequence[int], order: Sequence[int],
                 start: Sequence[float], end: Sequence[float], streams: bytes, times: Sequence[float],
                 accel: Sequence[int], host: Sequence[int], buffer_of: Sequence[int], in_order: bytes,
                 lt_buf: Sequence[int], lt_size: Sequence[int], lt_first: Sequence[int], lt_last: Sequence[int],
                 peak_event: int = -1):
        # ops: ``order[k]`` ran on ``STREAMS[streams[k]]`` from ``start[k]`` to ``end[k]`` (by position in the order)
        self.names, self.t_op, self.t_idx = names, t_op, t_idx
        self.order, self.start, self.end, self.streams = order, start, end, streams
        # timeline: after memory event ``k``, at ``times[k]``, ``accel[k]`` device and ``host[k]`` host bytes live
        self.times, self.accel, self.host = times, accel, host
        # tensor ``t``'s buffer is tensor ``buffer_of[t]``'s; ``in_order[t]``: its op is in the order
        self.buffer_of, self.in_order = buffer_of, in_order
        # device buffers in order of their first memory event: tensor, bytes, first and last event (inclusive)
        self.lt_buf, self.lt_size, self.lt_first, self.lt_last = lt_buf, lt_size, lt_first, lt_last
        # the memory event at which the device peaked (-1: none above the resident bytes)
        self.peak_event = peak_event
        self._views: dict[str, Any] = {}

    def tensor_name(self, t: int) -> str:
        return f"{self.names[self.t_op[t]]}:{self.t_idx[t]}"

    def view(self, kind: str) -> Any:
        """``"ops"``, ``"timeline"``, ``"buffer_owner"``, ``"buffer_lifetimes"`` or ``"live_at_peak"``, as
        :class:`SimResult` types them."""
        value = self._views.get(kind)
        if value is None:
            value = self._views[kind] = getattr(self, f"_build_{kind}")()
        return value

    def release(self) -> None:
        """Drop the views built so far (they are built again when read)."""
        self._views.clear()

    def _build_ops(self) -> tuple[OpRecord, ...]:
        names, new = self.names, tuple.__new__  # OpRecord(...) without the NamedTuple's Python-level __new__
        records = sorted(zip(self.start, self.end, map(names.__getitem__, self.order), self.streams))
        return tuple([new(OpRecord, (name, _device_of(stream), STREAMS[stream], t0, t1))
                      for t0, t1, name, stream in records])

    def _build_timeline(self) -> tuple[tuple[float, int, int], ...]:
        return tuple(zip(self.times, self.accel, self.host))

    def _build_buffer_owner(self) -> dict[str, str]:
        name, in_order = self.tensor_name, self.in_order
        return {name(t): name(o) for t, o in enumerate(self.buffer_of) if o != t and in_order[t]}

    def _build_buffer_lifetimes(self) -> tuple[tuple[str, int, int, int], ...]:
        name = self.tensor_name
        return tuple((name(t), size, first, last)
                     for t, size, first, last in zip(self.lt_buf, self.lt_size, self.lt_first, self.lt_last))

    def _build_live_at_peak(self) -> tuple[tuple[str, int], ...]:
        """The device buffers alive at the peak's event (allocated there or before, freed after it), largest first,
        then by name. (Sorted and named in each simulation, this was a twentieth of a tune's.)"""
        name, at = self.tensor_name, self.peak_event
        live = [(name(t), size) for t, size, first, last in zip(self.lt_buf, self.lt_size, self.lt_first, self.lt_last)
                if first <= at <= last]
        return tuple(sorted(live, key=lambda kv: (-kv[1], kv[0])))


def _device_of(stream: int) -> str:
    """The device class (``tflms.sim.indexed.ACCEL`` / ``HOST``) an op of ``stream`` ran on (a copy's destination)."""
    return "host" if stream in (1, 3) else "accelerator"


class _View:
    """A :class:`SimDetails` view, built on first use (see there); compares equal to the value it stands for."""

    __slots__ = ("_details", "_kind")

    def __init__(self, details: SimDetails, kind: str):
        self._details, self._kind = details, kind

    def _value(self) -> Any:
        return self._details.view(self._kind)

    def __len__(self) -> int:
        return len(self._value())

    def __iter__(self) -> Iterator:
        return iter(self._value())

    def __getitem__(self, key):
        return self._value()[key]

    def __contains__(self, item) -> bool:
        return item in self._value()

    def __eq__(self, other) -> bool:
        other = other._value() if isinstance(other, _View) else other
        return self._value() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._value())


class SequenceView(_View, Sequence):
    """``SimResult.ops``, ``timeline`` and ``buffer_lifetimes`` of a simulation (a tuple when built)."""


class MappingView(_View, Mapping):
    """``SimResult.buffer_owner`` of a simulation (a dict when built)."""


#: Relative round-off within which a step counts as lasting its compute time (:attr:`SimResult.compute_bound`; the
#: simulator sums the same op times in other orders).
COMPUTE_ROUND_OFF = 1e-9


@dataclasses.dataclass(frozen=True)
class SimResult:
    """The simulator's answer for one graph on one profile."""

    profile: str
    peak_bytes: int  # accelerator: resident + transient
    resident_bytes: int  # variables, optimizer slots, step arguments
    transient_peak_bytes: int  # peak of step activations alone
    peak_with_margin_bytes: int
    peak_time_s: float
    live_at_peak: Sequence[tuple[str, int]]  # (tensor, bytes), largest first (from the simulator, a view)
    host_peak_bytes: int
    step_time_s: float
    compute_time_s: float
    transfer_time_s: float
    stall_time_s: float  # time compute waited for transfers
    # The next four are tuples (a dict) or, from the simulator, views of its SimDetails built when first read
    # (``SequenceView``, ``MappingView``; :meth:`release_views`).
    timeline: Sequence[tuple[float, int, int]]  # (time, accelerator bytes, host bytes) after each change
    ops: Sequence[OpRecord]  # in order of (start, end, name)
    unknown_size_tensors: tuple[str, ...]
    buffer_owner: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)  # tensor -> buffer
    #: accelerator buffers as (name, bytes, first, last): alive from memory event ``first`` to ``last``
    #: inclusive (event indices in time order), the input of the memory planner (``tflms.plan``).
    buffer_lifetimes: Sequence[tuple[str, int, int, int]] = dataclasses.field(default=(), repr=False)
    details: SimDetails | None = dataclasses.field(default=None, repr=False, compare=False)
    #: The clock that timed the step (:mod:`tflms.sim.clock`: ``serial``, ``graph`` or ``xla``) and how many
    #: kernels it launched.
    clock: str = "serial"
    kernels: int = 0
    #: The compute stream's kernels back to back (``compute_time_s`` less the time kernels waited for their launch).
    kernel_time_s: float = 0.0

    def release_views(self) -> None:
        """Free the memory of ``ops``, ``timeline``, ``buffer_owner``, ``buffer_lifetimes`` and ``live_at_peak`` once
        built: they are built again from :attr:`details` when next read. The tuner calls it on candidates it is done
        with."""
        if self.details is not None:
            self.details.release()

    def op_spans(self, stream: str | None = None) -> dict[str, tuple[float, float]]:
        """By op name, when it ran, ``(start_s, end_s)``: what :attr:`ops` holds for the loops that look ops up by
        name, without its records or its sort (built from :attr:`details` where there are some); ``stream`` (one of
        :data:`STREAMS`) keeps that stream's ops alone."""
        details = self.details
        if details is None:
            return {r.name: (r.start_s, r.end_s) for r in self.ops if stream is None or r.stream == stream}
        names, spans = map(details.names.__getitem__, details.order), zip(details.start, details.end)
        if stream is None:
            return dict(zip(names, spans))
        code = STREAMS.index(stream)
        return {name: span for name, span, k in zip(names, spans, details.streams) if k == code}

    def tensors_sharing(self, owner: str) -> list[str]:
        """Tensors that live in ``owner``'s buffer (aliases and forwarded outputs)."""
        return sorted(t for t, o in self.buffer_owner.items() if o == owner)

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_with_margin_bytes <= budget_bytes

    @property
    def compute_bound(self) -> bool:
        """Whether the step lasts its compute time (to :data:`COMPUTE_ROUND_OFF`): the compute stream never waits, so
        no change that leaves its ops as they are (swaps, waits, triggers, order edges) makes the step faster."""
        return self.step_time_s <= self.compute_time_s * (1 + COMPUTE_ROUND_OFF)

    def overhead_vs(self, baseline: "SimResult") -> float:
        """Relative step-time overhead against ``baseline`` (0.1 = 10% slower)."""
        return self.step_time_s / baseline.step_time_s - 1.0 if baseline.step_time_s else 0.0

    def summary(self) -> dict:
        return {"profile": self.profile, "peak_bytes": self.peak_bytes, "resident_bytes": self.resident_bytes,
                "transient_peak_bytes": self.transient_peak_bytes,
                "peak_with_margin_bytes": self.peak_with_margin_bytes, "host_peak_bytes": self.host_peak_bytes,
                "step_time_s": self.step_time_s, "stall_time_s": self.stall_time_s,
                "transfer_time_s": self.transfer_time_s, "clock": self.clock}
