"""What every allocator model shares: the result and error types, the session protocol, chunk lists.

The models themselves are :mod:`tflms.memplan.bfc` (TensorFlow) and :mod:`tflms.memplan.caching`
(PyTorch); :func:`tflms.memplan.allocators.replay` drives either through a schedule.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Protocol

from tflms.errors import ConfigError, TflmsError
from tflms.units import format_bytes, parse_bytes

MiB = 1 << 20


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


def parse_limit(value: int | str | None) -> int | None:
    """A ``memory_limit_bytes`` value in bytes (None stays None); ConfigError unless positive."""
    if value is None:
        return None
    limit = parse_bytes(value, what="memory_limit_bytes")
    if limit <= 0:
        raise ConfigError(f"memory_limit_bytes must be positive, got {value!r}; use None for no limit")
    return limit


def check_tensor_request(allocator: str, tensor: str, num_bytes: int, live: Container[str]) -> None:
    """ConfigError if ``tensor`` is already allocated or ``num_bytes`` is not an int >= 0."""
    if tensor in live:
        raise ConfigError(f"{allocator}: tensor {tensor!r} is allocated twice without a free in between")
    if isinstance(num_bytes, bool) or not isinstance(num_bytes, int) or num_bytes < 0:
        raise ConfigError(f"{allocator}: tensor {tensor!r} requests {num_bytes!r} bytes; need an int >= 0")


def check_free(allocator: str, tensor: str, names: set[str]) -> None:
    """Forget ``tensor`` from ``names``; ConfigError if it is not allocated."""
    if tensor not in names:
        raise ConfigError(f"{allocator}: cannot free tensor {tensor!r}: it is not allocated")
    names.remove(tensor)


def round_up(num_bytes: int, multiple: int) -> int:
    """``num_bytes`` rounded up to a multiple of ``multiple``."""
    return -(-num_bytes // multiple) * multiple


@dataclass(eq=False)
class Region:
    """A region (BFC) or segment (caching) obtained from the device; ``first`` is its first chunk."""

    ptr: int
    size: int
    first: Chunk | None = None

    @property
    def end(self) -> int:
        return self.ptr + self.size


@dataclass(eq=False)
class Chunk:
    """A piece of a region or segment; ``tensor`` is set while in use."""

    ptr: int
    size: int
    owner: Region
    prev: Chunk | None = None
    next: Chunk | None = None
    tensor: str | None = None

    @property
    def in_use(self) -> bool:
        return self.tensor is not None


def merge_chunks(first: Chunk, second: Chunk) -> None:
    """Merge ``second`` (the chunk right after ``first``) into ``first``."""
    first.size += second.size
    first.next = second.next
    if second.next is not None:
        second.next.prev = first
