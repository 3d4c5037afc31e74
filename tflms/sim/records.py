"""The simulator's options and results: :class:`SimOptions`, :class:`OpRecord`, :class:`SimResult`.

The model they describe is in the module doc of :mod:`tflms.sim.simulator`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import NamedTuple

from tflms.devices import normalize_device
from tflms.errors import ConfigError


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "host_device", normalize_device(self.host_device, field="host_device"))
        workspaces = dict(self.workspace_bytes_per_element)
        for op_type, per_element in workspaces.items():
            if not isinstance(per_element, (int, float)) or per_element < 0:
                raise ConfigError(f"workspace_bytes_per_element[{op_type!r}] must be a number >= 0, "
                                  f"got {per_element!r}")
        object.__setattr__(self, "workspace_bytes_per_element", workspaces)
        if not 0 <= self.margin_fraction < 10:
            raise ConfigError(f"margin_fraction must be in [0, 10), got {self.margin_fraction}")
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


@dataclasses.dataclass(frozen=True)
class SimResult:
    """The simulator's answer for one graph on one profile."""

    profile: str
    peak_bytes: int  # accelerator: resident + transient
    resident_bytes: int  # variables, optimizer slots, step arguments
    transient_peak_bytes: int  # peak of step activations alone
    peak_with_margin_bytes: int
    peak_time_s: float
    live_at_peak: tuple[tuple[str, int], ...]  # (tensor, bytes), largest first
    host_peak_bytes: int
    step_time_s: float
    compute_time_s: float
    transfer_time_s: float
    stall_time_s: float  # time compute waited for transfers
    timeline: tuple[tuple[float, int, int], ...]  # (time, accelerator bytes, host bytes) after each change
    ops: tuple[OpRecord, ...]
    unknown_size_tensors: tuple[str, ...]
    buffer_owner: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)  # tensor -> buffer
    #: accelerator buffers as (name, bytes, first, last): alive from memory event ``first`` to ``last``
    #: inclusive (event indices in time order), the input of the memory planner (``tflms.plan``).
    buffer_lifetimes: tuple[tuple[str, int, int, int], ...] = dataclasses.field(default=(), repr=False)

    def tensors_sharing(self, owner: str) -> list[str]:
        """Tensors that live in ``owner``'s buffer (aliases and forwarded outputs)."""
        return sorted(t for t, o in self.buffer_owner.items() if o == owner)

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_with_margin_bytes <= budget_bytes

    def overhead_vs(self, baseline: "SimResult") -> float:
        """Relative step-time overhead against ``baseline`` (0.1 = 10% slower)."""
        return self.step_time_s / baseline.step_time_s - 1.0 if baseline.step_time_s else 0.0

    def summary(self) -> dict:
        return {"profile": self.profile, "peak_bytes": self.peak_bytes, "resident_bytes": self.resident_bytes,
                "transient_peak_bytes": self.transient_peak_bytes,
                "peak_with_margin_bytes": self.peak_with_margin_bytes, "host_peak_bytes": self.host_peak_bytes,
                "step_time_s": self.step_time_s, "stall_time_s": self.stall_time_s,
                "transfer_time_s": self.transfer_time_s}
