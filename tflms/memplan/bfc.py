"""A model of TensorFlow's best-fit-with-coalescing allocator, to replay a schedule's allocate/free calls.

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
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from tflms.errors import ConfigError
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
        object.__setattr__(self, "memory_limit_bytes", parse_limit(self.memory_limit_bytes))
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
    return round_up(num_bytes, BFC_MIN_ALLOCATION_BYTES)


def bfc_bin_for_size(num_bytes: int) -> int:
    """``BinNumForSize``: ``floor(log2(max(num_bytes, 256) / 256))``, capped at the last bin."""
    units = max(num_bytes, BFC_MIN_ALLOCATION_BYTES) // BFC_MIN_ALLOCATION_BYTES
    return min(BFC_NUM_BINS - 1, units.bit_length() - 1)


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
        self._regions: list[Region] = []
        self._next_region_ptr = 0
        self._bins: list[list[tuple[int, int]]] = [[] for _ in range(BFC_NUM_BINS)]
        self._free: dict[int, Chunk] = {}
        self._live: dict[str, Chunk] = {}
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
    def _insert_free(self, chunk: Chunk) -> None:
        bisect.insort(self._bins[bfc_bin_for_size(chunk.size)], (chunk.size, chunk.ptr))
        self._free[chunk.ptr] = chunk

    def _remove_free(self, chunk: Chunk) -> None:
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
        check_tensor_request(self.config.name, tensor, num_bytes, self._names)
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

    def _find_chunk(self, rounded: int) -> Chunk | None:
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

    def _split(self, chunk: Chunk, num_bytes: int) -> None:
        tail = Chunk(ptr=chunk.ptr + num_bytes, size=chunk.size - num_bytes, owner=chunk.owner,
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
            chunk = Chunk(ptr=ptr, size=region_bytes, owner=last, prev=tail)
            tail.next = chunk
        else:
            region = Region(ptr=ptr, size=region_bytes)
            chunk = Chunk(ptr=ptr, size=region_bytes, owner=region)
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
    def _region_in_use(region: Region) -> bool:
        chunk = region.first
        while chunk is not None:
            if chunk.in_use:
                return True
            chunk = chunk.next
        return False

    # --- free -----------------------------------------------------------------------------------------
    def free(self, tensor: str) -> None:
        """Free ``tensor``'s chunk and merge it with free neighbours (a 0-byte tensor is a no-op)."""
        check_free(self.config.name, tensor, self._names)
        chunk = self._live.pop(tensor, None)
        if chunk is None:
            return
        chunk.tensor = None
        self.allocated_bytes -= chunk.size
        self._insert_free(self._coalesce(chunk))

    def _coalesce(self, chunk: Chunk) -> Chunk:
        """``TryToCoalesce``: merge free next and previous neighbours into one chunk; return it."""
        following = chunk.next
        if following is not None and not following.in_use:
            self._remove_free(following)
            merge_chunks(chunk, following)
        preceding = chunk.prev
        if preceding is not None and not preceding.in_use:
            self._remove_free(preceding)
            merge_chunks(preceding, chunk)
            return preceding
        return chunk
