"""Models of real device allocators, to replay a schedule's allocate/free sequence.

A static plan (:mod:`tflms.memplan.offsets`) says what a schedule *could* fit in;
these models say what a framework's online allocator *will* reserve from the
device for the same sequence of calls (:func:`tflms.memplan.lifetimes.events`).

Each model is a frozen config; :meth:`open` returns a fresh mutable session
with ``allocate(tensor, num_bytes)`` / ``free(tensor)``. :func:`replay` drives a
session through a set of lifetimes and returns an :class:`AllocatorResult`.
Addresses are model addresses: regions/segments are laid out one after another
from address 0 in the order they are obtained, so ties broken "by address" are
broken by that order.

The models live in their own modules and are re-exported here:
:class:`BFCAllocatorModel` (TensorFlow's ``BFCAllocator``) in :mod:`tflms.memplan.bfc`,
:class:`CachingAllocatorModel` (PyTorch's CUDA caching allocator) in :mod:`tflms.memplan.caching`;
the result, error and session types they share in :mod:`tflms.memplan.allocator_base`.
"""

from __future__ import annotations

from collections.abc import Iterable

from tflms.memplan.allocator_base import (
    AllocatorModel,
    AllocatorResult,
    AllocatorSession,
    MiB,
    OutOfMemoryError,
)
from tflms.memplan.bfc import (
    BFC_INITIAL_REGION_BYTES,
    BFC_MAX_INTERNAL_FRAGMENTATION_BYTES,
    BFC_MIN_ALLOCATION_BYTES,
    BFC_NUM_BINS,
    BFC_REGION_GROWTH_FACTOR,
    BFCAllocatorModel,
    BFCSession,
    bfc_bin_for_size,
    bfc_rounded_bytes,
)
from tflms.memplan.caching import (
    CACHING_LARGE_BUFFER_BYTES,
    CACHING_MIN_BLOCK_BYTES,
    CACHING_MIN_LARGE_ALLOC_BYTES,
    CACHING_ROUND_LARGE_BYTES,
    CACHING_SMALL_BUFFER_BYTES,
    CACHING_SMALL_SIZE_BYTES,
    CachingAllocatorModel,
    CachingSession,
    caching_round_size,
    caching_segment_size,
)
from tflms.memplan.lifetimes import ALLOC, Lifetime, check_lifetimes, events, lower_bound

__all__ = [
    "BFC_INITIAL_REGION_BYTES", "BFC_MAX_INTERNAL_FRAGMENTATION_BYTES", "BFC_MIN_ALLOCATION_BYTES", "BFC_NUM_BINS",
    "BFC_REGION_GROWTH_FACTOR", "CACHING_LARGE_BUFFER_BYTES", "CACHING_MIN_BLOCK_BYTES",
    "CACHING_MIN_LARGE_ALLOC_BYTES", "CACHING_ROUND_LARGE_BYTES", "CACHING_SMALL_BUFFER_BYTES",
    "CACHING_SMALL_SIZE_BYTES", "AllocatorModel", "AllocatorResult", "AllocatorSession", "BFCAllocatorModel",
    "BFCSession", "CachingAllocatorModel", "CachingSession", "MiB", "OutOfMemoryError", "bfc_bin_for_size",
    "bfc_rounded_bytes", "caching_round_size", "caching_segment_size", "replay",
]


def replay(allocator: AllocatorModel, lifetimes: Iterable[Lifetime]) -> AllocatorResult:
    """Run the lifetimes' :func:`~tflms.memplan.lifetimes.events` through a fresh session of ``allocator``.

    Raises :class:`OutOfMemoryError` (naming the tensor and step) if the
    allocator's limit is exceeded.
    """
    items = check_lifetimes(lifetimes)
    session = allocator.open()
    for event in events(items):
        if event.kind == ALLOC:
            try:
                session.allocate(event.name, event.lifetime.size_bytes)
            except OutOfMemoryError as error:
                raise error.at_step(event.step) from None
        else:
            session.free(event.name)
    peak_live = lower_bound(items)
    reserved = session.peak_reserved_bytes
    fragmentation = reserved / peak_live - 1.0 if peak_live else 0.0
    return AllocatorResult(name=allocator.name, peak_reserved_bytes=reserved,
                           peak_allocated_bytes=session.peak_allocated_bytes,
                           fragmentation=fragmentation, peak_live_bytes=peak_live)
