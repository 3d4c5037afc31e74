"""Codec throughput on the user's device: measured, saved, loaded, or assumed.

:func:`calibrate` times each codec's ``encode`` and ``decode`` inside a
``tf.function`` on float32 ReLU-like data (``max(N(0, 1), 0)``, about half zeros)
on one device and returns :class:`CodecThroughputs`: GB/s (10**9 bytes of the
*uncompressed* tensor per second) per codec, taken at the largest size measured
(the steady state; smaller sizes pay per-kernel overheads). Throughputs save to and
load from JSON, and :func:`with_throughputs` attaches them to a hardware profile so
that the simulator costs encode/decode calls with them.

Without a calibration the cost model uses, per codec:

- :data:`CPU_DEFAULTS`: measured here with ``tools/bench_codecs.py`` (and
  ``calibrate``) on a 2-core x86-64 CPU with TensorFlow 2.21 (16 MiB inputs,
  median of 5 runs). Labelled CPU: a GPU is one to two orders of magnitude faster.
- :func:`assumed_for` a :class:`~tflms.profiles.HardwareProfile`: the
  *roofline* of the codec's TF kernels, ``effective memory bandwidth /
  memory passes`` (:data:`tflms.sim.cost.CODEC_TRAFFIC`, counted over the traced
  ops by :func:`memory_traffic`). The codecs are chains of element-wise kernels,
  memory-bound on a GPU, so this is an upper bound for unfused kernels; it is an
  *assumption*, not a measurement (no GPU was available). For scale: cDMA
  (Rhu et al., HPCA 2018, arXiv:1705.01626) compresses inside the DMA engine at
  link speed, and CSwap+ (Chen et al., IEEE TPDS 2022, doi:10.1109/TPDS.2022.3193867)
  runs its own fused CUDA (de)compression kernels on the V100; both are faster
  than these unfused TF-op codecs, so the assumption is conservative.

The ``tflms calibrate`` command (:func:`calibrate_main`)::

    tflms calibrate                              # table for the first GPU (else the CPU)
    tflms calibrate --device /device:GPU:1 --sizes-mib 4 64 --repeats 7 --output codecs.json
    tflms calibrate --json                       # JSON on stdout
    tflms calibrate --show-defaults [--profile v100-16gb-pcie3]   # documented defaults, no measuring
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tflms.errors import ConfigError
from tflms.sim.cost import CODEC_TRAFFIC, DECODE, ENCODE
from tflms.profiles import HardwareProfile, get_profile

logger = logging.getLogger(__name__)

BYTES_PER_GB = 10**9
BYTES_PER_MIB = 2**20
#: Input sizes calibrate measures by default (MiB of float32); the largest gives the summary.
DEFAULT_SIZES_MIB = (1.0, 16.0)
#: Timed calls per measurement (the median is kept), after one warm-up call.
DEFAULT_REPEATS = 5
DEFAULT_SEED = 0
#: JSON format version of a saved calibration.
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class CodecThroughput:
    """One codec's speed: uncompressed GB/s for encode and decode, and the ratio seen while measuring."""

    cost_key: str
    encode_gbps: float
    decode_gbps: float
    ratio: float | None = None  # uncompressed / encoded bytes on the calibration data (None: not measured)

    def __post_init__(self) -> None:
        for field in ("encode_gbps", "decode_gbps"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"codec {self.cost_key!r}: {field} must be a number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class CodecThroughputs:
    """Throughputs of several codecs on one device, with where they come from."""

    device: str
    source: str
    entries: tuple[CodecThroughput, ...]
    measurements: tuple[dict, ...] = ()  # per codec and size, when measured

    def __post_init__(self) -> None:
        keys = [e.cost_key for e in self.entries]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"codec throughputs list a codec twice: {keys}")

    def get(self, cost_key: str) -> CodecThroughput | None:
        return next((e for e in self.entries if e.cost_key == cost_key), None)

    def encode_bytes_per_s(self, cost_key: str) -> float | None:
        entry = self.get(cost_key)
        return None if entry is None else entry.encode_gbps * BYTES_PER_GB

    def decode_bytes_per_s(self, cost_key: str) -> float | None:
        entry = self.get(cost_key)
        return None if entry is None else entry.decode_gbps * BYTES_PER_GB

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "device": self.device, "source": self.source,
                "codecs": {e.cost_key: {"encode_gbps": e.encode_gbps, "decode_gbps": e.decode_gbps,
                                        "ratio": e.ratio} for e in self.entries},
                "measurements": list(self.measurements)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CodecThroughputs":
        if not isinstance(data, Mapping) or "codecs" not in data:
            raise ConfigError("not a tflms codec calibration: expected a JSON object with 'codecs'")
        if data.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise ConfigError(f"calibration format {data.get('format')!r} is not {FORMAT_VERSION}; recalibrate")
        entries = tuple(CodecThroughput(key, float(v["encode_gbps"]), float(v["decode_gbps"]), v.get("ratio"))
                        for key, v in sorted(data["codecs"].items()))
        return cls(str(data.get("device", "")), str(data.get("source", "")), entries,
                   tuple(data.get("measurements", ())))

    def save(self, path: str, *, replace: bool = True) -> None:
        """Write the JSON to ``path`` atomically (the file is the old one or the complete new one, never partial).

        ``replace=False`` refuses an existing file with :class:`FileExistsError`.
        """
        from tflms.atomicfs import write_file_atomic
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        write_file_atomic(path, text.encode("utf-8"), replace=replace)

    @classmethod
    def load(cls, path: str) -> "CodecThroughputs":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError) as err:
            raise ConfigError(f"cannot read codec calibration {path!r}: {err}") from err
        return cls.from_dict(data)

    def table(self) -> str:
        lines = [f"codec throughputs on {self.device} ({self.source})",
                 f"{'codec':<14}{'encode GB/s':>13}{'decode GB/s':>13}{'ratio':>8}"]
        for e in self.entries:
            ratio = "" if e.ratio is None else f"{e.ratio:.2f}"
            lines.append(f"{e.cost_key:<14}{e.encode_gbps:>13.3f}{e.decode_gbps:>13.3f}{ratio:>8}")
        return "\n".join(lines)


#: Measured here (tools/bench_codecs.py and calibrate, 16 MiB of float32 ReLU data, median of 5).
CPU_DEFAULTS = CodecThroughputs(
    device="CPU: 2-core x86-64 (AVX-512), TensorFlow 2.21 CPU build",
    source="measured with tools/bench_codecs.py, 16 MiB float32 ReLU(N(0,1)) input, median of 5 calls",
    entries=(
        CodecThroughput("zvc", 0.494, 0.523, 1.882),
        CodecThroughput("fp16", 2.422, 7.997, 2.0),
        CodecThroughput("fp16-nosat", 11.970, 12.089, 2.0),
        CodecThroughput("bf16", 2.471, 12.188, 2.0),
        CodecThroughput("bf16-nosat", 10.018, 10.590, 2.0),
        CodecThroughput("int8-block", 0.548, 0.713, 3.765),
    ))


def assumed_for(profile: str | HardwareProfile) -> CodecThroughputs:
    """Roofline throughputs on ``profile`` (see the module doc): an assumption, not a measurement."""
    profile = get_profile(profile)
    bandwidth = profile.effective_memory_bytes_per_s
    entries = tuple(CodecThroughput(key, bandwidth / t.encode_passes / BYTES_PER_GB,
                                    bandwidth / t.decode_passes / BYTES_PER_GB)
                    for key, t in sorted(CODEC_TRAFFIC.items()))
    return CodecThroughputs(device=f"{profile.name} (assumed)",
                            source=f"roofline: {profile.memory_gbps:g} GB/s x "
                                   f"{bandwidth / (profile.memory_gbps * 1e9):g} "
                                   "efficiency / memory passes of the unfused TF kernels "
                                   "(tflms.sim.cost.CODEC_TRAFFIC)",
                            entries=entries)


@dataclasses.dataclass(frozen=True)
class CalibratedProfile(HardwareProfile):
    """A hardware profile whose codec calls the simulator costs with measured throughputs."""

    codec_throughputs: CodecThroughputs | None = None


def with_throughputs(profile: str | HardwareProfile, throughputs: CodecThroughputs) -> CalibratedProfile:
    """``profile`` carrying ``throughputs`` (same name: a calibration of that device)."""
    profile = get_profile(profile)
    fields = {f.name: getattr(profile, f.name) for f in dataclasses.fields(HardwareProfile)}
    return CalibratedProfile(**fields, codec_throughputs=throughputs)


# ------------------------------------------------------------------ measuring
def _default_device() -> str:
    import tensorflow as tf
    return "/device:GPU:0" if tf.config.list_logical_devices("GPU") else "/device:CPU:0"


def _sync() -> None:
    import tensorflow as tf
    sync = getattr(getattr(tf.test, "experimental", None), "sync_devices", None)
    if sync is not None:
        sync()


def _median_s(fn, args: Sequence[Any], repeats: int) -> float:
    fn(*args)  # warm-up: traces and touches the memory
    _sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args)
        _sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def default_calibration_codecs() -> list:
    """Every codec at its defaults, plus the non-saturating cast variants."""
    from tflms.compress.codecs import CODEC_NAMES, get_codec
    codecs = []
    for name in CODEC_NAMES:
        codec = get_codec(name)
        codecs.append(codec)
        if hasattr(codec, "saturate"):
            codecs.append(type(codec)(saturate=False))
    return codecs


def calibrate(device: str | None = None, sizes: Sequence[float] = DEFAULT_SIZES_MIB, *,
              codecs: Sequence[Any] | None = None, repeats: int = DEFAULT_REPEATS,
              seed: int = DEFAULT_SEED) -> CodecThroughputs:
    """Measure encode/decode throughput of ``codecs`` on ``device`` (default: first GPU, else CPU).

    ``sizes``: input sizes in MiB of float32; the summary uses the largest.
    """
    import numpy as np
    import tensorflow as tf

    from tflms.compress.codecs import encoded_nbytes, get_codec
    from tflms.config import normalize_device

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an int >= 1, got {repeats!r}")
    sizes = sorted(float(s) for s in sizes)
    if not sizes or sizes[0] <= 0:
        raise ConfigError(f"sizes must be positive MiB values, got {sizes!r}")
    device = normalize_device(device or _default_device(), field="device")
    local = "/device:" + device.rpartition("/device:")[2]
    available = {f"/device:{d.device_type}:{d.name.rsplit(':', 1)[-1]}" for d in tf.config.list_logical_devices()}
    if local not in available:
        raise ConfigError(f"device {device!r} does not exist here; available: {sorted(available)}")
    codec_objs = [get_codec(c) if isinstance(c, str) else c for c in (codecs or default_calibration_codecs())]
    measurements, entries = [], []
    rng = np.random.default_rng(seed)
    for codec in codec_objs:
        last = None
        for size in sizes:
            n = max(1, int(size * BYTES_PER_MIB) // 4)
            data = np.maximum(rng.standard_normal(n, dtype=np.float32), 0)
            with tf.device(device):
                x = tf.constant(data)
                shape, dtype = x.shape, x.dtype
                encode = tf.function(codec.encode, autograph=False)
                decode = tf.function(lambda *p, c=codec, s=shape, d=dtype: c.decode(p, s, d), autograph=False)
                parts = encode(x)
                encode_s = _median_s(encode, [x], repeats)
                decode_s = _median_s(decode, list(parts), repeats)
            nbytes = n * 4
            last = {"codec": codec.cost_key, "size_mib": size, "input_bytes": nbytes,
                    "encoded_bytes": encoded_nbytes(parts), "encode_s": encode_s, "decode_s": decode_s,
                    "encode_gbps": nbytes / encode_s / BYTES_PER_GB, "decode_gbps": nbytes / decode_s / BYTES_PER_GB}
            measurements.append(last)
        entries.append(CodecThroughput(codec.cost_key, last["encode_gbps"], last["decode_gbps"],
                                       last["input_bytes"] / last["encoded_bytes"] if last["encoded_bytes"] else None))
    return CodecThroughputs(device=device, source=f"tflms calibrate: float32 ReLU(N(0,1)) input, {sizes[-1]:g} MiB, "
                            f"median of {repeats} calls, TensorFlow {tf.__version__}",
                            entries=tuple(entries), measurements=tuple(measurements))


def memory_traffic(codec: Any, num_elements: int = 2**20, nonzero_fraction: float = 0.5,
                   dtype: str = "float32") -> dict[str, float]:
    """Count the memory traffic of ``codec``'s traced TF ops (the figures in ``CODEC_TRAFFIC``).

    Every op that is not metadata-only reads its inputs and writes its outputs
    once; a dimension TensorFlow cannot know (the non-zeros) counts as
    ``nonzero_fraction * num_elements``. Returns passes (traffic / uncompressed
    bytes) and kernel counts for encode and decode.
    """
    import tensorflow as tf

    from tflms.compress.codecs import get_codec
    from tflms.sim.cost import FREE_OPS
    codec = get_codec(codec) if isinstance(codec, str) else codec
    metadata_only = FREE_OPS | {"Bitcast", "Pack"}
    tf_dtype = tf.as_dtype(dtype)
    enc = tf.function(codec.encode, autograph=False).get_concrete_function(tf.TensorSpec([num_elements], tf_dtype))
    specs = [tf.TensorSpec(o.shape, o.dtype) for o in enc.outputs]
    dec = tf.function(lambda *p: codec.decode(p, [num_elements], tf_dtype),
                      autograph=False).get_concrete_function(*specs)
    out: dict[str, float] = {}
    for role, cf in ((ENCODE, enc), (DECODE, dec)):
        traffic, kernels = 0, 0
        for op in cf.graph.get_operations():
            if op.type in metadata_only:
                continue
            kernels += 1
            for t in list(op.inputs) + list(op.outputs):
                if t.dtype in (tf.resource, tf.variant):
                    continue
                dims = t.shape.as_list() if t.shape.rank is not None else [None]
                count = 1
                for d in dims:
                    count *= d if d is not None else int(nonzero_fraction * num_elements)
                traffic += count * t.dtype.size
        out[f"{role}_passes"] = traffic / (num_elements * tf_dtype.size)
        out[f"{role}_kernels"] = kernels
    return out


# ------------------------------------------------------------------ CLI
CLI_HELP = "measure the compression codecs' encode/decode throughput on this machine"
CLI_DESCRIPTION = ("Time every codec's encode and decode (inside tf.function, on float32 ReLU data) on one device "
                   "and print GB/s of uncompressed tensor per second; --output saves a JSON calibration that "
                   "tflms.compress.calibrate.CodecThroughputs.load reads back. --show-defaults prints the documented "
                   "defaults instead of measuring.")


def add_calibrate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``tflms calibrate`` (for the ``tflms`` command's subparser, or :func:`calibrate_main`)."""
    parser.add_argument("--device", default=None, help="device to measure (default: first GPU, else the CPU)")
    parser.add_argument("--sizes-mib", nargs="+", type=float, default=list(DEFAULT_SIZES_MIB),
                        help="input sizes in MiB of float32; the largest gives the summary (default: 1 16)")
    parser.add_argument("--codecs", nargs="+", default=None,
                        help="codec names (default: all, with the non-saturating fp16/bf16 variants)")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS, help="timed calls per measurement")
    parser.add_argument("--output", "-o", default=None,
                        help="save the calibration as JSON to this file (written atomically; an existing file only "
                             "with --replace)")
    parser.add_argument("--replace", action="store_true", help="replace an existing --output file")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--show-defaults", action="store_true",
                        help="print the documented defaults (CPU measured here, or --profile's roofline) and exit")
    parser.add_argument("--profile", default=None, help="with --show-defaults: the profile whose roofline to show")
    return parser


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Run ``tflms calibrate`` for parsed ``args``; raises :class:`ConfigError` on bad options."""
    if args.output:
        check_output_file(args.output, replace=args.replace)  # before measuring, not after
    if args.show_defaults:
        result = assumed_for(args.profile) if args.profile else CPU_DEFAULTS
    else:
        result = calibrate(args.device, args.sizes_mib, codecs=args.codecs, repeats=args.repeats)
    if args.output:
        try:
            result.save(args.output, replace=args.replace)
        except FileExistsError:
            raise ConfigError(f"--output {args.output} was created by something else while measuring; it was left "
                              "as it is. Pass --replace to replace it, or choose another file") from None
        except OSError as err:
            raise ConfigError(f"cannot write --output {args.output}: {err.strerror or err}; nothing was "
                              "written") from err
    print(json.dumps(result.to_dict(), indent=2, sort_keys=True) if args.json else result.table())
    return 0


def check_output_file(path: str, *, replace: bool) -> None:
    """A :class:`ConfigError` naming the fix if the calibration cannot be written to ``path``."""
    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    if os.path.isdir(target):
        raise ConfigError(f"--output {path} is a directory; give a file name, e.g. "
                          f"{os.path.join(path, 'codecs.json')}")
    if not os.path.isdir(parent):
        raise ConfigError(f"the directory of --output {path} does not exist; create {parent} first")
    if os.path.lexists(target) and not replace:
        raise ConfigError(f"--output {path} already exists; pass --replace to replace it (atomically, once the "
                          "measurement is done), or choose another file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot write --output {path}: {parent} is not writable; choose another file")


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    """``tflms calibrate`` as a standalone entry point; see the module doc."""
    parser = add_calibrate_arguments(argparse.ArgumentParser(prog="tflms calibrate", description=CLI_DESCRIPTION))
    args = parser.parse_args(argv)
    try:
        return cmd_calibrate(args)
    except ConfigError as err:
        parser.error(str(err))
        return 2  # not reached: parser.error exits
