"""tflms under ``tf.distribute``: where each replica's swaps run.

Under ``MirroredStrategy`` and ``MultiWorkerMirroredStrategy`` the traced step
holds one copy of the forward/backward computation per local replica
(``replica_1/...``, ``gradient_tape/replica_1/...``), each pinned by the
strategy to its replica device, e.g. ``/job:localhost/replica:0/task:0/device:GPU:1``
or, on worker 1 of a cluster, ``/job:worker/replica:0/task:1/device:GPU:0``.
tflms plans the swaps of every replica in that one graph (each replica's
tensors are ordinary forward tensors); this module decides where they run.

**The host of a replica** is the ``host_device`` of the config (``/device:CPU:0``
by default) *on the replica's own task*: the replica device with its device
type and index replaced by the host's, e.g. ``/job:worker/replica:0/task:1/device:CPU:0``
for ``/job:worker/replica:0/task:1/device:GPU:0``. All replicas of one machine
share that machine's host memory (as they share its PCIe root); a replica never
swaps to another task's memory over the network. A ``host_device`` that names a
job or task itself (``/job:worker/task:0/device:CPU:0``) is taken literally.

**Placement of one replica's swap** (``Identity`` copies, the default):

- the swap-out runs on the replica's host: TensorFlow copies the tensor from
  the replica device to the host (``_Send`` on the replica device, ``_Recv`` on
  the host);
- the swap-in runs on the replica's host too, delayed by its trigger (a control
  edge from an op of the same replica);
- the consumers keep their replica device, so TensorFlow's host-to-device copy
  delivers the tensor back to the replica that produced it.

A ``DeepCopy`` swap-in (the measurement mode placed on the accelerator) goes to
the replica device of the swapped tensor, not to ``accelerator_device``: under a
strategy there is one accelerator per replica. ``accelerator_device`` then only
names the device whose memory reports and the tuner describe.

A graph whose ops carry no device (the default strategy, no ``tf.device``) is
left exactly as the rewrite produced it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tflms.errors import GraphError
from tflms.ir.graph import Graph
from tflms.passes.result import PassResult
from tflms.policies.swapplan import SwapPlan

logger = logging.getLogger(__name__)

__all__ = ["Placement", "SwapPlacement", "host_for", "place_swaps"]


@dataclasses.dataclass(frozen=True)
class SwapPlacement:
    """Where one swapped tensor's copies run.

    ``replica_device``: the producer's device ("" when the graph does not place
    it); ``host_device``: where the swap-out runs; ``swap_in_devices``: one per
    swap-in, in plan order; ``consumer_devices``: the devices of the consumers
    the swap-ins feed (sorted, unique).
    """

    tensor: str
    replica_device: str
    host_device: str
    swap_out: str
    swap_ins: tuple[str, ...]
    swap_in_devices: tuple[str, ...]
    consumer_devices: tuple[str, ...]

    @property
    def stays_on_replica(self) -> bool:
        """True if every consumer fed back by a swap-in runs on the producer's device."""
        return not self.replica_device or self.consumer_devices == (self.replica_device,)


@dataclasses.dataclass(frozen=True)
class Placement:
    """The placement of every swap of one rewritten step (see the module doc)."""

    swaps: tuple[SwapPlacement, ...]

    def by_replica(self) -> dict[str, list[SwapPlacement]]:
        """Swaps grouped by the replica device that produced the tensor (sorted by device)."""
        groups: dict[str, list[SwapPlacement]] = {}
        for swap in self.swaps:
            groups.setdefault(swap.replica_device, []).append(swap)
        return dict(sorted(groups.items()))

    def table(self) -> str:
        """One line per replica device: its host and how many tensors it swaps."""
        if not self.swaps:
            return "placement: nothing swapped"
        lines = ["placement: replica device -> host device: swapped tensors"]
        for device, swaps in self.by_replica().items():
            hosts = sorted({s.host_device for s in swaps})
            lines.append(f"  {device or '(unplaced)'} -> {', '.join(hosts)}: {len(swaps)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"swaps": [dataclasses.asdict(s) for s in self.swaps]}


def host_for(replica_device: str, host_device: str) -> str:
    """The host device of a replica (see the module doc).

    ``host_for("/job:worker/replica:0/task:1/device:GPU:0", "/device:CPU:0")`` is
    ``"/job:worker/replica:0/task:1/device:CPU:0"``. An empty ``replica_device``,
    or a ``host_device`` that names a job or task, returns ``host_device``.
    """
    if not replica_device:
        return host_device
    import tensorflow as tf
    host = tf.DeviceSpec.from_string(host_device)
    if host.job is not None or host.task is not None:
        return host_device
    replica = tf.DeviceSpec.from_string(replica_device)
    return replica.replace(device_type=host.device_type, device_index=host.device_index).to_string()


def _follow_compression(graph: Graph, plan: SwapPlan, moves: dict[str, str]) -> None:
    """Place compressed swaps' extra ops (``tflms.compress.rewrite``) like the swap they belong to.

    Part ``k > 0`` copies go where their part-0 copy goes; encode and decode ops run
    on the replica that produced the tensor.
    """
    from tflms.compress.rewrite import decode_op_name, encode_op_name, part_op_name
    for swap in plan.swaps:
        replica = graph.op(swap.tensor.op).device
        encode = encode_op_name(swap.tensor)
        if encode not in graph:
            continue
        moves[encode] = replica
        for base in (swap.swap_out, *(g.name for g in swap.swap_ins)):
            k = 1
            while part_op_name(base, k) in graph:
                moves[part_op_name(base, k)] = moves[base]
                k += 1
        for gi, _ in enumerate(swap.swap_ins):
            if decode_op_name(swap.tensor, gi) in graph:
                moves[decode_op_name(swap.tensor, gi)] = replica


def place_swaps(graph: Graph, plan: SwapPlan) -> PassResult:
    """Put each swap's ops on the host of the replica that produced the tensor.

    ``graph`` is the output of ``apply_swaps(original, plan).graph``; it is not
    modified. Returns the placed graph (``graph`` itself when no swapped tensor
    has a device, so unplaced graphs stay byte-identical), with the
    :class:`Placement` as the report.
    Raises :class:`~tflms.errors.GraphError` if a swap op of ``plan`` is missing.
    """
    config = plan.config
    swaps: list[SwapPlacement] = []
    moves: dict[str, str] = {}
    for swap in plan.swaps:
        for name in (swap.swap_out, *(g.name for g in swap.swap_ins)):
            if name not in graph:
                raise GraphError(f"swap op {name!r} of the plan is not in the graph: place_swaps takes the graph "
                                 "apply_swaps returned for this plan")
        replica = graph.op(swap.tensor.op).device
        host = host_for(replica, config.host_device)
        moves[swap.swap_out] = host
        swap_in_devices = []
        for group in swap.swap_ins:
            current = graph.op(group.name).device
            if current == config.host_device:
                device = host
            elif current == plan.accelerator_device and replica:
                device = replica
            else:
                device = current
            moves[group.name] = device
            swap_in_devices.append(device)
        consumers = sorted({graph.op(c).device for g in swap.swap_ins for c in g.consumers})
        swaps.append(SwapPlacement(tensor=swap.tensor.name, replica_device=replica, host_device=host,
                                   swap_out=swap.swap_out, swap_ins=tuple(g.name for g in swap.swap_ins),
                                   swap_in_devices=tuple(swap_in_devices), consumer_devices=tuple(consumers)))
    placement = Placement(tuple(swaps))
    _follow_compression(graph, plan, moves)
    changed = {name: device for name, device in moves.items() if graph.op(name).device != device}
    if not changed:
        return PassResult(graph, changed=False, report=placement)
    placed = graph.copy()
    for name, device in changed.items():
        placed.op(name).device = device  # a device is not an edge: no index to keep current
    for swap in swaps:
        if not swap.stays_on_replica:
            logger.warning("tflms: %s is produced on %s but swapped back to consumers on %s", swap.tensor,
                           swap.replica_device, ", ".join(swap.consumer_devices))
    logger.info("tflms: %s", placement.table().replace("\n", "; "))
    return PassResult(placed, changed=True, report=placement)
