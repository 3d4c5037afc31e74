"""Measure the encode and decode throughput of the tflms codecs on this machine.

Each codec runs inside a ``tf.function`` (graph mode, as it would inside a
rewritten training step) on float32 ReLU-like data (``max(N(0, 1), 0)``, about
half zeros) of a few sizes; throughput is bytes of *input* per second, in GB/s
(10**9 bytes), from the median of ``--repeats`` timed calls after one warm-up
call. These numbers are the seed of the cost model's default codec
throughputs (a future ``tflms calibrate``).

    python tools/bench_codecs.py                       # table, 1/16/64 MiB, all codecs
    python tools/bench_codecs.py --sizes-mib 4 --codecs zvc fp16 --repeats 3
    python tools/bench_codecs.py --json > codecs.json  # {"environment": {...}, "records": [...]}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from typing import Sequence

DEFAULT_SIZES_MIB = (1, 16, 64)
DEFAULT_REPEATS = 5
DEFAULT_SEED = 0
BYTES_PER_MIB = 2**20
BYTES_PER_GB = 10**9
RELU_DTYPE = "float32"


@dataclasses.dataclass(frozen=True)
class BenchRecord:
    """Throughput of one codec on one input size (times are medians, in seconds)."""

    codec: str
    variant: str
    dtype: str
    size_mib: float
    input_bytes: int
    encoded_bytes: int
    ratio: float
    encode_s: float
    decode_s: float
    encode_gbps: float
    decode_gbps: float
    repeats: int


def _median_seconds(fn, args: Sequence, repeats: int) -> float:
    fn(*args)  # warm-up: traces the tf.function and touches the memory
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_codec(codec, size_mib: float, repeats: int, seed: int = DEFAULT_SEED) -> BenchRecord:
    """Time ``codec`` on ``size_mib`` MiB of float32 ReLU(N(0, 1)) data."""
    import numpy as np
    import tensorflow as tf

    from tflms.compress.codecs import encoded_nbytes

    num_elements = int(size_mib * BYTES_PER_MIB) // np.dtype(RELU_DTYPE).itemsize
    data = np.maximum(np.random.default_rng(seed).standard_normal(num_elements, dtype=np.float32), 0)
    x = tf.constant(data)
    shape, dtype = x.shape, x.dtype
    encode = tf.function(codec.encode)
    decode = tf.function(lambda *parts: codec.decode(parts, shape, dtype))
    parts = encode(x)
    encode_s = _median_seconds(encode, [x], repeats)
    decode_s = _median_seconds(decode, list(parts), repeats)
    input_bytes = num_elements * dtype.size
    encoded = encoded_nbytes(parts)
    return BenchRecord(
        codec=codec.name, variant=repr(codec), dtype=dtype.name, size_mib=size_mib, input_bytes=input_bytes,
        encoded_bytes=encoded, ratio=input_bytes / encoded, encode_s=encode_s, decode_s=decode_s,
        encode_gbps=input_bytes / encode_s / BYTES_PER_GB, decode_gbps=input_bytes / decode_s / BYTES_PER_GB,
        repeats=repeats)


def default_codecs(codec_names: Sequence[str]) -> list:
    """The named codecs with default parameters, each cast codec followed by its ``saturate=False`` variant."""
    from tflms.compress.codecs import get_codec

    codecs = []
    for name in codec_names:
        codec = get_codec(name)
        codecs.append(codec)
        if hasattr(codec, "saturate"):
            codecs.append(type(codec)(saturate=False))
    return codecs


def run(codecs: Sequence, sizes_mib: Sequence[float], repeats: int) -> list[BenchRecord]:
    """Benchmark every codec at every size; records in that order."""
    return [bench_codec(codec, size, repeats) for codec in codecs for size in sizes_mib]


def environment() -> dict:
    import numpy as np
    import tensorflow as tf

    return {
        "tensorflow": tf.__version__, "numpy": np.__version__, "python": platform.python_version(),
        "machine": platform.machine(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
        "devices": [d.name for d in tf.config.list_logical_devices()],
    }


def format_table(records: Sequence[BenchRecord]) -> str:
    width = max([len("codec")] + [len(r.variant) for r in records])
    header = (f"{'codec':<{width}} {'MiB':>6} {'ratio':>6} {'encode GB/s':>12} {'decode GB/s':>12} "
              f"{'encode ms':>10} {'decode ms':>10}")
    lines = [header, "-" * len(header)]
    for r in records:
        lines.append(f"{r.variant:<{width}} {r.size_mib:>6g} {r.ratio:>6.3f} {r.encode_gbps:>12.3f} "
                     f"{r.decode_gbps:>12.3f} {r.encode_s * 1e3:>10.2f} {r.decode_s * 1e3:>10.2f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--codecs", nargs="+", default=None, help="codec names (default: all)")
    parser.add_argument("--sizes-mib", nargs="+", type=float, default=list(DEFAULT_SIZES_MIB),
                        help="input sizes in MiB of float32 (default: 1 16 64)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed calls per measurement")
    parser.add_argument("--json", action="store_true", help="print JSON {environment, records} instead of a table")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if any(size <= 0 for size in args.sizes_mib):
        parser.error("--sizes-mib must be positive")

    try:
        from tflms.compress.codecs import CODEC_NAMES
    except ImportError:  # run as a script from a checkout that is not installed
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tflms.compress.codecs import CODEC_NAMES
    from tflms.errors import ConfigError

    try:
        records = run(default_codecs(args.codecs or CODEC_NAMES), args.sizes_mib, args.repeats)
    except ConfigError as err:
        parser.error(str(err))
    if args.json:
        print(json.dumps({"environment": environment(), "records": [dataclasses.asdict(r) for r in records]},
                         indent=2))
    else:
        print(format_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
