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

:class:`BFCAllocatorModel` follows TensorFlow's ``BFCAllocator``
(``tensorflow/tsl/framework/bfc_allocator.{h,cc}``, formerly
``tensorflow/core/common_runtime/``). Modelled:

- every request is rounded up to a multiple of 256 bytes (``kMinAllocationSize``);
  a 0-byte request allocates nothing;
- 21 bins; bin ``b`` holds free chunks of size ``>= 256 << b`` (the last bin
  everything bigger); each bin is ordered by (size, address);
- best fit: search from the bin of the rounded size upward and take the first
  (smallest, then lowest-address) chunk that is big enough;
- the chunk is split when ``chunk >= 2 * rounded`` or
  ``chunk - rounded >= max_internal_fragmentation`` (128 MiB, or
  ``fragmentation_fraction * memory_limit`` when that option is > 0); otherwise
  the caller gets the whole chunk, padding included;
- on free, the chunk merges with a free next and a free previous neighbour;
- growth (``Extend``): with ``allow_growth`` the first region is 2 MiB (or the
  limit if smaller); a request bigger than the current region size doubles it
  until it fits and that size is used; otherwise the region is allocated at the
  current size and the size doubles *afterwards*. A region is capped at what is
  left under the limit (rounded down to 256 bytes). Without ``allow_growth`` the
  first region is the whole limit;
- regions are separate (neighbouring chunks in different regions never merge),
  unless ``coalesce_regions`` (TF does this when its sub-allocator supports it,
  e.g. the GPU virtual-memory allocator);
- when nothing fits and growth fails under the limit, ``garbage_collection``
  frees every region with no chunk in use (if that would make room) and
  extends again (``DeallocateFreeRegions``; TF's GPU default is on);
- peak reserved = most bytes held in regions at once (TF's
  ``total_region_allocated_bytes_``); peak allocated = most bytes in chunks
  handed out, padding included (TF's ``peak_bytes_in_use``).

Not modelled: the retry-on-failure wait for other threads to free memory
(``AllocatorRetry``; a replay is single-threaded); freed-at timestamps and
``MergeTimestampedChunks`` (``timing_counter_`` is unset for the default GPU
allocator, so TF coalesces immediately, as here); the backpedal of a failed
sub-allocation to 90 % (the model's device never fails below the limit); the
sub-allocator's own alignment and bookkeeping; several streams or devices.

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
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Protocol

from tflms.errors import ConfigError, TflmsError
from tflms.memplan.lifetimes import ALLOC, Lifetime, check_lifetimes, events, lower_bound
from tflms.units import format_bytes, parse_bytes

MiB = 1 << 20

# --- TensorFlow BFCAllocator constants (bfc_allocator.h / .cc) ---------------------------------------
BFC_MIN_ALLOCATION_BYTES = 256
"""``kMinAllocationSize``: every chunk is a multiple of this; also the smallest bin's chunk size."""

BFC_NUM_BINS = 21
"""``kNumBins``: bin ``b`` holds free chunks of at least ``256 << b`` bytes; the last one takes all bigger."""

BFC_INITIAL_REGION_BYTES = 2 * MiB
"""With ``allow_growth``, the first region is this big (or the memory limit, if smaller)."""

BFC_REGION_GROWTH_FACTOR = 2
"""``curr_region_allocation_bytes_`` is multiplied by this when regions grow."""

BFC_MAX_INTERNAL_FRAGMENTATION_BYTES = 128 * MiB
"""A chunk is split when the unused tail would be at least this big (unless ``fragmentation_fraction`` > 0)."""

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


class OutOfMemoryError(TflmsError):
    """An allocator model cannot serve a request within its ``memory_limit_bytes``."""

    def __init__(self, allocator: str, tensor: str, requested_bytes: int, reserved_bytes: int,
                 limit_bytes: int, largest_free_bytes: int, step: int | None = None) -> None:
        self.allocator = allocator
        self.tensor = tensor
        self.requested_bytes = requested_bytes
        self.reserved_bytes = reserved_bytes
        self.limit_bytes = limit_bytes
        self.largest_free_bytes = largest_free_bytes
        self.step = step
        where = f" at step {step}" if step is not None else ""
        super().__init__(
            f"{allocator}: out of memory allocating tensor {tensor!r} ({requested_bytes} bytes){where}: "
            f"{format_bytes(reserved_bytes)} reserved of a {format_bytes(limit_bytes)} limit, largest free "
            f"block {format_bytes(largest_free_bytes)}. Raise memory_limit_bytes, or compare with a static "
            "plan (tflms.memplan.offsets.best_plan) to see how much is lost to fragmentation")

    def at_step(self, step: int) -> OutOfMemoryError:
        """The same error, with the schedule step in its message."""
        return OutOfMemoryError(self.allocator, self.tensor, self.requested_bytes, self.reserved_bytes,
                                self.limit_bytes, self.largest_free_bytes, step)


@dataclass(frozen=True)
class AllocatorResult:
    """What an allocator model needed for one replay.

    ``peak_reserved_bytes``: most bytes held from the device at once.
    ``peak_allocated_bytes``: most bytes handed out to tensors at once, rounding and padding included.
    ``peak_live_bytes``: the lower bound, most bytes the tensors themselves need at once.
    ``fragmentation``: ``peak_reserved_bytes / peak_live_bytes - 1`` (0.0 when nothing is live).
    """

    name: str
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    fragmentation: float
    peak_live_bytes: int = 0


class AllocatorSession(Protocol):
    """A running allocator: the state of one replay."""

    def allocate(self, tensor: str, num_bytes: int) -> int | None:
        """Allocate ``num_bytes`` for ``tensor`` and return its address (None for 0 bytes)."""

    def free(self, tensor: str) -> None:
        """Free the memory of ``tensor``."""

    @property
    def peak_reserved_bytes(self) -> int:
        """Most bytes held from the device at once so far."""

    @property
    def peak_allocated_bytes(self) -> int:
        """Most bytes handed out to tensors at once so far."""


class AllocatorModel(Protocol):
    """An allocator configuration that can start sessions."""

    name: str

    def open(self) -> AllocatorSession:
        """Return a fresh session holding no memory."""


def _parse_limit(value: int | str | None) -> int | None:
    if value is None:
        return None
    limit = parse_bytes(value, what="memory_limit_bytes")
    if limit <= 0:
        raise ConfigError(f"memory_limit_bytes must be positive, got {value!r}; use None for no limit")
    return limit


def _check_tensor_request(allocator: str, tensor: str, num_bytes: int, live: Container[str]) -> None:
    if tensor in live:
        raise ConfigError(f"{allocator}: tensor {tensor!r} is allocated twice without a free in between")
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 0:
        raise ConfigError(f"{allocator}: tensor {tensor!r} requests {num_bytes!r} bytes; need an int >= 0")


def _check_free(allocator: str, tensor: str, names: set[str]) -> None:
    if tensor not in names:
        raise ConfigError(f"{allocator}: cannot free tensor {tensor!r}: it is not allocated")
    names.remove(tensor)


def _round_up(num_bytes: int, multiple: int) -> int:
    return -(-num_bytes // multiple) * multiple


# ======================================================================================================
# TensorFlow BFC allocator
# ======================================================================================================

@dataclass(frozen=True)
class BFCAllocatorModel:
    """Configuration of a model of TensorFlow's best-fit-with-coalescing allocator (see the module doc).

    ``memory_limit_bytes`` (int or a string like ``"16GiB"``; None = unlimited)
    is TF's ``total_memory``. ``allow_growth=False`` needs a limit and reserves
    all of it on the first allocation, as TF's GPU default does.
    """

    memory_limit_bytes: int | str | None = None
    allow_growth: bool = True
    garbage_collection: bool = True
    coalesce_regions: bool = False
    fragmentation_fraction: float = 0.0
    name: str = "bfc"

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory_limit_bytes", _parse_limit(self.memory_limit_bytes))
        if not self.allow_growth and self.memory_limit_bytes is None:
            raise ConfigError("BFCAllocatorModel(allow_growth=False) reserves the whole memory limit up front, "
                              "so it needs memory_limit_bytes; set one or use allow_growth=True")
        if not 0.0 <= self.fragmentation_fraction < 1.0:
            raise ConfigError(f"fragmentation_fraction must be in [0, 1), got {self.fragmentation_fraction!r}; "
                              "0 means TF's default of 128 MiB")

    @property
    def max_internal_fragmentation_bytes(self) -> int:
        """A chunk is split when its unused tail would be at least this many bytes."""
        if self.fragmentation_fraction > 0.0 and self.memory_limit_bytes is not None:
            return int(self.fragmentation_fraction * self.memory_limit_bytes)
        return BFC_MAX_INTERNAL_FRAGMENTATION_BYTES

    def open(self) -> BFCSession:
        """Return a fresh session holding no memory."""
        return BFCSession(self)


def bfc_rounded_bytes(num_bytes: int) -> int:
    """``RoundedBytes``: ``num_bytes`` rounded up to a multiple of 256."""
    return _round_up(num_bytes, BFC_MIN_ALLOCATION_BYTES)


def bfc_bin_for_size(num_bytes: int) -> int:
    """``BinNumForSize``: ``floor(log2(max(num_bytes, 256) / 256))``, capped at the last bin."""
    units = max(num_bytes, BFC_MIN_ALLOCATION_BYTES) // BFC_MIN_ALLOCATION_BYTES
    return min(BFC_NUM_BINS - 1, units.bit_length() - 1)


@dataclass(eq=False)
class _Region:
    ptr: int
    size: int
    first: _Chunk | None = None

    @property
    def end(self) -> int:
        return self.ptr + self.size


@dataclass(eq=False)
class _Chunk:
    """A piece of a region or segment; ``tensor`` is set while in use."""

    ptr: int
    size: int
    owner: _Region
    prev: _Chunk | None = None
    next: _Chunk | None = None
    tensor: str | None = None

    @property
    def in_use(self) -> bool:
        return self.tensor is not None


def _merge(first: _Chunk, second: _Chunk) -> None:
    """Merge ``second`` (the chunk right after ``first``) into ``first``."""
    first.size += second.size
    first.next = second.next
    if second.next is not None:
        second.next.prev = first


class BFCSession:
    """The state of one BFC allocator replay (create it with :meth:`BFCAllocatorModel.open`)."""

    def __init__(self, config: BFCAllocatorModel) -> None:
        self.config = config
        limit = config.memory_limit_bytes
        if config.allow_growth:
            initial = BFC_INITIAL_REGION_BYTES if limit is None else min(limit, BFC_INITIAL_REGION_BYTES)
        else:
            assert limit is not None
            initial = limit
        self.curr_region_allocation_bytes = bfc_rounded_bytes(initial)
        self.reserved_bytes = 0
        self.allocated_bytes = 0
        self.peak_reserved_bytes = 0
        self.peak_allocated_bytes = 0
        self._regions: list[_Region] = []
        self._next_region_ptr = 0
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(BFC_NUM_BINS)]
        self._free: dict[int, _Chunk] = {}
        self._live: dict[str, _Chunk] = {}
        self._names: set[str] = set()  # every allocated tensor, 0-byte ones included

    # --- inspection ---------------------------------------------------------------------------------
    def address_of(self, tensor: str) -> int:
        """Address of a live tensor's chunk."""
        return self._live[tensor].ptr

    def chunk_bytes_of(self, tensor: str) -> int:
        """Size of the chunk a live tensor got (rounding and unsplit padding included)."""
        return self._live[tensor].size

    def free_chunks(self) -> list[tuple[int, int]]:
        """Every free chunk as (address, size), by address."""
        return sorted((chunk.ptr, chunk.size) for chunk in self._free.values())

    def regions(self) -> list[tuple[int, int]]:
        """Every region as (address, size), by address."""
        return [(region.ptr, region.size) for region in self._regions]

    # --- bins -----------------------------------------------------------------------------------------
    def _insert_free(self, chunk: _Chunk) -> None:
        bisect.insort(self._bins[bfc_bin_for_size(chunk.size)], (chunk.size, chunk.ptr))
        self._free[chunk.ptr] = chunk

    def _remove_free(self, chunk: _Chunk) -> None:
        bin_chunks = self._bins[bfc_bin_for_size(chunk.size)]
        bin_chunks.pop(bisect.bisect_left(bin_chunks, (chunk.size, chunk.ptr)))
        del self._free[chunk.ptr]

    def _largest_free(self) -> int:
        return max((chunk.size for chunk in self._free.values()), default=0)

    # --- allocation -----------------------------------------------------------------------------------
    def allocate(self, tensor: str, num_bytes: int) -> int | None:
        """Allocate ``num_bytes`` for ``tensor``; return the chunk address (None for 0 bytes).

        Raises :class:`OutOfMemoryError` when the limit leaves no room.
        """
        _check_tensor_request(self.config.name, tensor, num_bytes, self._names)
        if num_bytes == 0:
            self._names.add(tensor)
            return None
        rounded = bfc_rounded_bytes(num_bytes)
        chunk = self._find_chunk(rounded)
        if chunk is None and self._extend(rounded):
            chunk = self._find_chunk(rounded)
        if chunk is None and self._deallocate_free_regions(rounded) and self._extend(rounded):
            chunk = self._find_chunk(rounded)
        if chunk is None:
            assert self.config.memory_limit_bytes is not None, "without a limit, growth always succeeds"
            raise OutOfMemoryError(self.config.name, tensor, num_bytes, self.reserved_bytes,
                                   self.config.memory_limit_bytes, self._largest_free())
        chunk.tensor = tensor
        self._live[tensor] = chunk
        self._names.add(tensor)
        self.allocated_bytes += chunk.size
        self.peak_allocated_bytes = max(self.peak_allocated_bytes, self.allocated_bytes)
        return chunk.ptr

    def _find_chunk(self, rounded: int) -> _Chunk | None:
        """``FindChunkPtr``: best fit from the request's bin upward, splitting when worthwhile."""
        for bin_chunks in self._bins[bfc_bin_for_size(rounded):]:
            index = bisect.bisect_left(bin_chunks, (rounded, -1))
            if index == len(bin_chunks):
                continue
            chunk = self._free[bin_chunks[index][1]]
            self._remove_free(chunk)
            if (chunk.size >= 2 * rounded
                    or chunk.size - rounded >= self.config.max_internal_fragmentation_bytes):
                self._split(chunk, rounded)
            return chunk
        return None

    def _split(self, chunk: _Chunk, num_bytes: int) -> None:
        tail = _Chunk(ptr=chunk.ptr + num_bytes, size=chunk.size - num_bytes, owner=chunk.owner,
                      prev=chunk, next=chunk.next)
        if chunk.next is not None:
            chunk.next.prev = tail
        chunk.next = tail
        chunk.size = num_bytes
        self._insert_free(tail)

    def _extend(self, rounded: int) -> bool:
        """``Extend``: obtain one more region big enough for ``rounded`` bytes, if the limit allows."""
        limit = self.config.memory_limit_bytes
        if limit is None:
            available = None
        else:
            available = (limit - self.reserved_bytes) // BFC_MIN_ALLOCATION_BYTES * BFC_MIN_ALLOCATION_BYTES
            if rounded > available:
                return False
        increased = False
        while rounded > self.curr_region_allocation_bytes:
            self.curr_region_allocation_bytes *= BFC_REGION_GROWTH_FACTOR
            increased = True
        region_bytes = self.curr_region_allocation_bytes
        if available is not None:
            region_bytes = min(region_bytes, available)
        if not increased:
            self.curr_region_allocation_bytes *= BFC_REGION_GROWTH_FACTOR
        self.reserved_bytes += region_bytes
        self.peak_reserved_bytes = max(self.peak_reserved_bytes, self.reserved_bytes)

        ptr = self._next_region_ptr
        self._next_region_ptr += region_bytes
        last = self._regions[-1] if self._regions else None
        if self.config.coalesce_regions and last is not None and last.end == ptr:
            last.size += region_bytes
            tail = last.first
            assert tail is not None
            while tail.next is not None:
                tail = tail.next
            chunk = _Chunk(ptr=ptr, size=region_bytes, owner=last, prev=tail)
            tail.next = chunk
        else:
            region = _Region(ptr=ptr, size=region_bytes)
            chunk = _Chunk(ptr=ptr, size=region_bytes, owner=region)
            region.first = chunk
            self._regions.append(region)
        self._insert_free(self._coalesce(chunk))
        return True

    def _deallocate_free_regions(self, rounded: int) -> bool:
        """``DeallocateFreeRegions``: give back regions with nothing in use, if that makes room."""
        limit = self.config.memory_limit_bytes
        if not self.config.garbage_collection or limit is None:
            return False
        unused = [region for region in self._regions if not self._region_in_use(region)]
        unused_bytes = sum(region.size for region in unused)
        if unused_bytes == 0 or rounded > limit - self.reserved_bytes + unused_bytes:
            return False
        for region in unused:
            chunk = region.first
            while chunk is not None:
                self._remove_free(chunk)
                chunk = chunk.next
            self.reserved_bytes -= region.size
            self._regions.remove(region)
        return True

    @staticmethod
    def _region_in_use(region: _Region) -> bool:
        chunk = region.first
        while chunk is not None:
            if chunk.in_use:
                return True
            chunk = chunk.next
        return False

    # --- free -----------------------------------------------------------------------------------------
    def free(self, tensor: str) -> None:
        """Free ``tensor``'s chunk and merge it with free neighbours (a 0-byte tensor is a no-op)."""
        _check_free(self.config.name, tensor, self._names)
        chunk = self._live.pop(tensor, None)
        if chunk is None:
            return
        chunk.tensor = None
        self.allocated_bytes -= chunk.size
        self._insert_free(self._coalesce(chunk))

    def _coalesce(self, chunk: _Chunk) -> _Chunk:
        """``TryToCoalesce``: merge free next and previous neighbours into one chunk; return it."""
        following = chunk.next
        if following is not None and not following.in_use:
            self._remove_free(following)
            _merge(chunk, following)
        preceding = chunk.prev
        if preceding is not None and not preceding.in_use:
            self._remove_free(preceding)
            _merge(preceding, chunk)
            return preceding
        return chunk



# ======================================================================================================
# PyTorch CUDA caching allocator
# ======================================================================================================

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
        object.__setattr__(self, "memory_limit_bytes", _parse_limit(self.memory_limit_bytes))

    def open(self) -> CachingSession:
        """Return a fresh session holding no memory."""
        return CachingSession(self)


def caching_round_size(num_bytes: int) -> int:
    """``round_size``: at least 512 bytes, else rounded up to a multiple of 512."""
    return max(CACHING_MIN_BLOCK_BYTES, _round_up(num_bytes, CACHING_MIN_BLOCK_BYTES))


def caching_segment_size(rounded_bytes: int) -> int:
    """``get_allocation_size``: how big a new segment is for a request of ``rounded_bytes``."""
    if rounded_bytes <= CACHING_SMALL_SIZE_BYTES:
        return CACHING_SMALL_BUFFER_BYTES
    if rounded_bytes < CACHING_MIN_LARGE_ALLOC_BYTES:
        return CACHING_LARGE_BUFFER_BYTES
    return _round_up(rounded_bytes, CACHING_ROUND_LARGE_BYTES)


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
        self._segments: list[tuple[str, _Region]] = []
        self._next_segment_ptr = 0
        self._pools: dict[str, list[tuple[int, int]]] = {self.SMALL: [], self.LARGE: []}
        self._free: dict[int, tuple[str, _Chunk]] = {}
        self._live: dict[str, tuple[str, _Chunk]] = {}
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
    def _insert_free(self, pool: str, block: _Chunk) -> None:
        bisect.insort(self._pools[pool], (block.size, block.ptr))
        self._free[block.ptr] = (pool, block)

    def _remove_free(self, pool: str, block: _Chunk) -> None:
        blocks = self._pools[pool]
        blocks.pop(bisect.bisect_left(blocks, (block.size, block.ptr)))
        del self._free[block.ptr]

    # --- allocation -----------------------------------------------------------------------------------
    def allocate(self, tensor: str, num_bytes: int) -> int | None:
        """Allocate ``num_bytes`` for ``tensor``; return the block address (None for 0 bytes).

        Raises :class:`OutOfMemoryError` when a needed segment would exceed the limit.
        """
        _check_tensor_request(self.config.name, tensor, num_bytes, self._names)
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
            tail = _Chunk(ptr=block.ptr + size, size=remaining, owner=block.owner, prev=block, next=block.next)
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

    def _get_free_block(self, pool: str, size: int) -> _Chunk | None:
        blocks = self._pools[pool]
        index = bisect.bisect_left(blocks, (size, -1))
        if index == len(blocks):
            return None
        _, block = self._free[blocks[index][1]]
        self._remove_free(pool, block)
        return block

    def _alloc_segment(self, pool: str, size: int) -> _Chunk | None:
        segment_bytes = caching_segment_size(size)
        limit = self.config.memory_limit_bytes
        if limit is not None and self.reserved_bytes + segment_bytes > limit:
            return None
        segment = _Region(ptr=self._next_segment_ptr, size=segment_bytes)
        self._next_segment_ptr += segment_bytes
        block = _Chunk(ptr=segment.ptr, size=segment_bytes, owner=segment)
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
        _check_free(self.config.name, tensor, self._names)
        entry = self._live.pop(tensor, None)
        if entry is None:
            return
        pool, block = entry
        block.tensor = None
        self.allocated_bytes -= block.size
        following = block.next
        if following is not None and not following.in_use:
            self._remove_free(pool, following)
            _merge(block, following)
        preceding = block.prev
        if preceding is not None and not preceding.in_use:
            self._remove_free(pool, preceding)
            _merge(preceding, block)
            block = preceding
        self._insert_free(pool, block)


# ======================================================================================================
# Replay
# ======================================================================================================

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
