"""A model of PyTorch's CUDA caching allocator, to replay a schedule's allocate/free calls.

:class:`CachingAllocatorModel` follows PyTorch's CUDA caching allocator
(``c10/cuda/CUDACachingAllocator.cpp``) with its default configuration. Modelled:

- requests are rounded up to a multiple of 512 bytes (at least 512); 0 bytes
  allocates nothing;
- rounded sizes <= 1 MiB use the small pool, the rest the large pool; blocks
  never move between pools;
- best fit: the smallest cached free block of the pool that is big enough
  (ties: lowest address);
- a new segment (``cudaMalloc``) is 2 MiB for small requests, 20 MiB for
  requests below 10 MiB, else the request rounded up to 2 MiB;
- a small-pool block is split when >= 512 bytes would remain, a large-pool
  block when > 1 MiB would remain;
- on free, a block merges with free neighbours of the same segment; segments
  never merge and are never returned to the device, except
- when a new segment would exceed ``memory_limit_bytes`` (PyTorch's
  ``set_per_process_memory_fraction``): every cached segment with no block in
  use is released and the segment is tried again (``release_cached_blocks``).

Not modelled: streams and CUDA events, ``max_split_size_mb`` and
``roundup_power2_divisions`` (off by default), ``expandable_segments``, the
garbage-collection threshold, CUDA graph private pools.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tflms.memplan.allocator_base import (
    Chunk,
    MiB,
    OutOfMemoryError,
    Region,
    check_free,
    check_tensor_request,
    merge_chunks,
    parse_limit,
    round_up,
)

# --- PyTorch CUDACachingAllocator constants (CUDACachingAllocator.cpp) --------------------------------
CACHING_MIN_BLOCK_BYTES = 512
"""``kMinBlockSize``: every request is rounded up to a multiple of this (and at least this)."""

CACHING_SMALL_SIZE_BYTES = 1 * MiB
"""``kSmallSize``: the largest request served by the small pool; also the large-pool split threshold."""

CACHING_SMALL_BUFFER_BYTES = 2 * MiB
"""``kSmallBuffer``: the segment size obtained for small-pool requests."""

CACHING_LARGE_BUFFER_BYTES = 20 * MiB
"""``kLargeBuffer``: the segment size obtained for large requests below ``CACHING_MIN_LARGE_ALLOC_BYTES``."""

CACHING_MIN_LARGE_ALLOC_BYTES = 10 * MiB
"""``kMinLargeAlloc``: requests at least this big get a segment of their own size (rounded)."""

CACHING_ROUND_LARGE_BYTES = 2 * MiB
"""``kRoundLarge``: segments for requests >= ``CACHING_MIN_LARGE_ALLOC_BYTES`` are rounded up to this."""


@dataclass(frozen=True)
class CachingAllocatorModel:
    """Configuration of a model of PyTorch's CUDA caching allocator (see the module doc).

    ``memory_limit_bytes`` (int, a string like ``"16GiB"``, or None = unlimited)
    caps the bytes held in segments, like ``set_per_process_memory_fraction``.
    """

    memory_limit_bytes: int | str | None = None
    release_cached_on_oom: bool = True
    name: str = "caching"

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_limit_bytes", parse_limit(self.memory_limit_bytes))

    def open(self) -> CachingSession:
        """Return a fresh session holding no memory."""
        return CachingSession(self)


def caching_round_size(num_bytes: int) -> int:
    """``round_size``: at least 512 bytes, else rounded up to a multiple of 512."""
    return max(CACHING_MIN_BLOCK_BYTES, round_up(num_bytes, CACHING_MIN_BLOCK_BYTES))


def caching_segment_size(rounded_bytes: int) -> int:
    """``get_allocation_size``: how big a new segment is for a request of ``rounded_bytes``."""
    if rounded_bytes <= CACHING_SMALL_SIZE_BYTES:
        return CACHING_SMALL_BUFFER_BYTES
    if rounded_bytes < CACHING_MIN_LARGE_ALLOC_BYTES:
        return CACHING_LARGE_BUFFER_BYTES
    return round_up(rounded_bytes, CACHING_ROUND_LARGE_BYTES)


class CachingSession:
    """The state of one caching-allocator replay (create it with :meth:`CachingAllocatorModel.open`)."""

    SMALL = "small"
    LARGE = "large"

    def __init__(self, config: CachingAllocatorModel) -> None:
        self.config = config
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self._segments: list[tuple[str, Region]] = []
        self._next_segment_ptr = 0
        self._pools: dict[str, list[tuple[int, int]]] = {self.SMALL: [], self.LARGE: []}
        self._free: dict[int, tuple[str, Chunk]] = {}
        self._live: dict[str, tuple[str, Chunk]] = {}
        self._names: set[str] = set()  # every allocated tensor, 0-byte ones included

    # --- inspection ---------------------------------------------------------------------------------
    def address_of(self, tensor: str) -> int:
        """Address of a live tensor's block."""
        return self._live[tensor][1].ptr

    def block_bytes_of(self, tensor: str) -> int:
        """Size of the block a live tensor got (rounding and unsplit remainder included)."""
        return self._live[tensor][1].size

    def free_blocks(self) -> list[tuple[str, int, int]]:
        """Every cached free block as (pool, address, size), by address."""
        return sorted(((pool, block.ptr, block.size) for pool, block in self._free.values()),
                      key=lambda item: item[1])

    def segments(self) -> list[tuple[str, int, int]]:
        """Every segment held from the device as (pool, address, size), by address."""
        return [(pool, segment.ptr, segment.size) for pool, segment in self._segments]

    # --- pools ----------------------------------------------------------------------------------------
    def _insert_free(self, pool: str, block: Chunk) -> None:
        bisect.insort(self._pools[pool], (block.size, block.ptr))
        self._free[block.ptr] = (pool, block)

    def _remove_free(self, pool: str, block: Chunk) -> None:
        blocks = self._pools[pool]
        blocks.pop(bisect.bisect_left(blocks, (block.size, block.ptr)))
        del self._free[block.ptr]

    # --- allocation -----------------------------------------------------------------------------------
    def allocate(self, tensor: str, num_bytes: int) -> int | None:
        """Allocate ``num_bytes`` for ``tensor``; return the block address (None for 0 bytes).

        Raises :class:`OutOfMemoryError` when a needed segment would exceed the limit.
        """
        check_tensor_request(self.config.name, tensor, num_bytes, self._names)
        if num_bytes == 0:
            self._names.add(tensor)
            return None
        size = caching_round_size(num_bytes)
        pool = self.SMALL if size <= CACHING_SMALL_SIZE_BYTES else self.LARGE
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_segment(pool, size)
            if block is None and self.config.release_cached_on_oom and self._release_cached_segments():
                block = self._alloc_segment(pool, size)
            if block is None:
                assert self.config.memory_limit_bytes is not None, "without a limit, segments always succeed"
                largest = max((block.size for _, block in self._free.values()), default=0)
                raise OutOfMemoryError(self.config.name, tensor, num_bytes, self.reserved_bytes,
                                       self.config.memory_limit_bytes, largest)
        remaining = block.size - size
        should_split = (remaining >= CACHING_MIN_BLOCK_BYTES if pool == self.SMALL
                        else remaining > CACHING_SMALL_SIZE_BYTES)
        if should_split:
            tail = Chunk(ptr=block.ptr + size, size=remaining, owner=block.owner, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next = tail
            block.size = size
            self._insert_free(pool, tail)
        block.tensor = tensor
        self._live[tensor] = (pool, block)
        self._names.add(tensor)
        self.allocated_bytes += block.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return block.ptr

    def _get_free_block(self, pool: str, size: int) -> Chunk | None:
        blocks = self._pools[pool]
        index = bisect.bisect_left(blocks, (size, -1))
        if index == len(blocks):
            return None
        _, block = self._free[blocks[index][1]]
        self._remove_free(pool, block)
        return block

    def _alloc_segment(self, pool: str, size: int) -> Chunk | None:
        segment_bytes = caching_segment_size(size)
        limit = self.config.memory_limit_bytes
        if limit is not None and self.reserved_bytes + segment_bytes > limit:
            return None
        segment = Region(ptr=self._next_segment_ptr, size=segment_bytes)
        self._next_segment_ptr += segment_bytes
        block = Chunk(ptr=segment.ptr, size=segment_bytes, owner=segment)
        segment.first = block
        self._segments.append((pool, segment))
        self.reserved_bytes += segment_bytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)
        return block

    def _release_cached_segments(self) -> bool:
        """``release_cached_blocks``: give every segment that is one whole free block back to the device."""
        released = False
        for pool, block in list(self._free.values()):
            if block.prev is None and block.next is None:
                self._remove_free(pool, block)
                self._segments = [(p, s) for p, s in self._segments if s is not block.owner]
                self.reserved_bytes -= block.size
                released = True
        return released

    # --- free -----------------------------------------------------------------------------------------
    def free(self, tensor: str) -> None:
        """Return ``tensor``'s block to its pool, merged with free neighbours (0-byte tensor: no-op)."""
        check_free(self.config.name, tensor, self._names)
        entry = self._live.pop(tensor, None)
        if entry is None:
            return
        pool, block = entry
        block.tensor = None
        self.allocated_bytes -= block.size
        following = block.next
        if following is not None and not following.in_use:
            self._remove_free(pool, following)
            merge_chunks(block, following)
        preceding = block.prev
        if preceding is not None and not preceding.in_use:
            self._remove_free(pool, preceding)
            merge_chunks(preceding, block)
            block = preceding
        self._insert_free(pool, block)
