"""Pinned host memory: TensorFlow's cap on it, and the check that a plan's swapped bytes fit under it.

Where a swapped tensor lands on the host, read from TensorFlow 2.21's sources (docs/design.md,
"Pinned host memory", gives files and functions): the swap-out is a host op reading a GPU tensor, so
graph partitioning puts a ``_Send`` on the GPU and a ``_Recv`` on the CPU; the executor marks that
``_Recv``'s output ``gpu_compatible`` (the sink of a GPU-to-CPU copy), and the rendezvous allocates the
copy's destination with those attributes from the CPU device, which hands ``gpu_compatible``
allocations to the pinned ``gpu_host_bfc`` allocator. The swap-out and swap-in ``Identity`` ops forward
that buffer. So every swapped tensor is held in pinned memory, and TensorFlow caps pinned memory at
``TF_GPU_HOST_MEM_LIMIT_IN_MB`` (default :data:`DEFAULT_PINNED_LIMIT_MB`): past it the step fails with
an out-of-memory error on the host. :func:`check_pinned_host_bytes` refuses such a plan before
anything runs. Pure: it reads the environment only through the mapping it is given (``os.environ``
by default), and works without a GPU (e.g. for a GPU profile simulated on a CPU machine).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping

from tflms.errors import ConfigError, HostMemoryError
from tflms.units import format_bytes

MIB = 2**20
#: The environment variable TensorFlow reads for the pinned (``gpu_host_bfc``) allocator's limit, in MiB.
PINNED_LIMIT_ENV = "TF_GPU_HOST_MEM_LIMIT_IN_MB"
#: Its default when unset: ``1LL << 17`` MiB = 128 GiB (``GPUProcessState::GetGpuHostAllocator``,
#: tensorflow/core/common_runtime/gpu/gpu_process_state.cc; 64 GiB in older releases).
DEFAULT_PINNED_LIMIT_MB = 1 << 17


@dataclasses.dataclass(frozen=True)
class PinnedLimit:
    """The pinned host memory TensorFlow will allow: ``limit_bytes``, and ``source``, one phrase saying why."""

    limit_bytes: int
    source: str


def pinned_host_limit(environ: Mapping[str, str] | None = None) -> PinnedLimit:
    """The limit TensorFlow's ``gpu_host_bfc`` allocator will apply: ``TF_GPU_HOST_MEM_LIMIT_IN_MB`` when set,
    else :data:`DEFAULT_PINNED_LIMIT_MB`.

    ``environ`` defaults to ``os.environ``. A value that is no integer raises
    :class:`~tflms.errors.ConfigError` naming it (TensorFlow logs an error and applies its default; a
    planner that silently did the same would check a limit the user did not mean). TensorFlow reads the
    variable once, when it first pins memory; ``GPUOptions.Experimental.gpu_host_mem_limit_in_mb``, when
    set above 0 in a session config, overrides it (not read here).
    """
    env = os.environ if environ is None else environ
    raw = env.get(PINNED_LIMIT_ENV)
    if raw is None:
        return PinnedLimit(DEFAULT_PINNED_LIMIT_MB * MIB,
                           f"{PINNED_LIMIT_ENV} unset: TensorFlow's default, {DEFAULT_PINNED_LIMIT_MB} MiB")
    try:
        mb = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{PINNED_LIMIT_ENV}={raw!r} is not a whole number of MiB; set it to e.g. "
                          f"{DEFAULT_PINNED_LIMIT_MB} (TensorFlow's default) or unset it") from None
    return PinnedLimit(max(mb, 0) * MIB, f"{PINNED_LIMIT_ENV}={raw.strip()}")


def check_pinned_host_bytes(needed_bytes: int, limit: PinnedLimit | None = None, *,
                            what: str = "the plan") -> PinnedLimit:
    """Raise :class:`~tflms.errors.HostMemoryError` when ``needed_bytes`` of swapped tensors held on the host
    at once exceed ``limit`` (default :func:`pinned_host_limit`); return the limit otherwise.

    The message names the variable, the bytes needed and the value that would let the plan run.
    """
    limit = pinned_host_limit() if limit is None else limit
    if needed_bytes <= limit.limit_bytes:
        return limit
    raise HostMemoryError(
        f"{what} holds up to {format_bytes(needed_bytes)} ({needed_bytes} bytes) of swapped tensors on the host "
        f"at once, and TensorFlow keeps them in pinned memory (its gpu_host_bfc allocator), capped at "
        f"{format_bytes(limit.limit_bytes)} ({limit.source}): the step would run out of host memory. Raise the cap "
        f"before TensorFlow starts, to at least {PINNED_LIMIT_ENV}={math.ceil(needed_bytes / MIB)} (MiB; the host "
        "must have that much memory it can pin, and the allocator's rounding may need a little more), or swap "
        "less (a larger budget, min_swap_bytes, exclude_scopes)")
