"""Measure an NVIDIA GPU the way tflms's cost model describes one, and write it as a profile.

Runs on a machine with an NVIDIA GPU and PyTorch or CuPy; TensorFlow's GPU build is not
needed, and tflms is not imported (the probe runs where only a GPU library is installed).
It measures, with CUDA events, the median of ``--repeats`` timed runs after a warm-up:

- host-to-device and device-to-host copies, from pinned and from pageable host memory, one
  direction at a time and both at once (two streams);
- the same copies while a large matrix product runs on another stream (how much of a copy
  hides behind compute, and what it costs the product);
- matrix-product rates for fp32 (TF32 off), tf32, fp16 and bf16 (square ``--matmul-n``);
- one convolution (PyTorch only: a ResNet-50 3x3 layer at batch 64, float32 and bfloat16);
- HBM bandwidth: a device-to-device copy, counted as bytes read plus written;
- with ``--conv-layers``, ResNet-50's convolutions forward and backward in both layouts; with ``--elementwise``,
  element-wise ops on an activation (what a recompute plan re-runs); with ``--batchnorm`` (PyTorch only),
  training-mode batch normalisation on ResNet-50's activations, forward and backward, in both layouts; with
  ``--attention`` (PyTorch only), BERT-base's attention-probability chain op by op and back to back, against the
  host copies of its largest tensor (what the tuner weighs: recompute it or swap it).

The JSON it writes has ``device`` (name, memory, driver, library versions, date), the raw
``measurements`` and a ``profile`` object of :class:`tflms.profiles.HardwareProfile`'s fields
that ``tflms`` loads (``--profile-file PATH`` on the command line, ``LMSConfig(profile=PATH)``).

    python tools/gpu_probe.py                              # table, and JSON to stdout with --json
    python tools/gpu_probe.py --json -o docs/profiles/h100.json
    python tools/gpu_probe.py --backend cupy --repeats 5 --copy-mib 256
    python tools/gpu_probe.py --attention --json -o h100-attention.json

Its tests (tests/test_gpu_probe.py) run without a GPU, through :class:`StandInBackend`.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import statistics
import sys
from typing import Any, Callable, Protocol

MIB = 2**20
GIB = 2**30
MATMUL_MODES = ("fp32", "tf32", "fp16", "bf16")
#: ResNet-50's conv3_x 3x3 layer: batch, channels in/out, height/width, kernel.
CONV_SHAPE = (64, 128, 128, 28, 3)
#: ``--conv-layers``: ResNet-50's stride-1 convolutions at batch 64 (224x224 input), one of each shape.
RESNET50_CONVS = ((64, 64, 64, 56, 1), (64, 64, 64, 56, 3), (64, 64, 256, 56, 1), (64, 256, 64, 56, 1),
                  (64, 128, 128, 28, 3), (64, 128, 512, 28, 1), (64, 512, 128, 28, 1),
                  (64, 256, 256, 14, 3), (64, 256, 1024, 14, 1), (64, 1024, 256, 14, 1),
                  (64, 512, 512, 7, 3), (64, 512, 2048, 7, 1), (64, 2048, 512, 7, 1))
CONV_LAYOUTS = ("nchw", "nhwc")
#: ``--elementwise``: ops a recompute plan re-runs (activations, normalisation arithmetic, residual adds, a
#: per-channel reduction), on a ResNet-50 activation at batch 64 (64 x 56 x 56 x 256, channels last).
ELEMENTWISE_SHAPE = (64, 56, 56, 256)
ELEMENTWISE_OPS = ("relu", "add", "mul", "sum")
#: ``--batchnorm``: the distinct activation shapes ResNet-50 normalises at batch 64 (224x224 input), as batch,
#: channels, height = width. Checked against ``keras.applications.ResNet50(weights=None)`` (Keras 3.15): its 53
#: BatchNormalization layers have these 9 output shapes (1, 6, 4, 8, 5, 12, 7, 6 and 4 layers of each, in order).
RESNET50_BATCHNORMS = ((64, 64, 112), (64, 64, 56), (64, 256, 56), (64, 128, 28), (64, 512, 28), (64, 256, 14),
                       (64, 1024, 14), (64, 512, 7), (64, 2048, 7))
BATCHNORM_DTYPES = ("float32", "bfloat16")
#: GPU clock cycles (about 2 ms) of the sleep each timed batch norm queues behind (``TorchBackend._timed``).
QUEUE_CYCLES = 4_000_000
#: ``--attention``: BERT-base's self-attention (12 heads of size 64) at sequence 512, as heads, sequence, head size;
#: the batch is ``--attention-batch`` (:data:`ATTENTION_BATCH`). Q and K are (batch, heads, sequence, head size),
#: every tensor of the chain (batch, heads, sequence, sequence): 12 MiB per sample in float32.
ATTENTION_HEADS, ATTENTION_SEQUENCE, ATTENTION_HEAD_SIZE = 12, 512, 64
#: Batch 8: the chain's tensors are 96 MiB (float32) and 48 MiB (bfloat16), so every kernel runs 30 us or more on an
#: H100 (well above launch overhead, and each is queued behind a GPU sleep anyway) and each host copy about 1-2 ms
#: (far above the link's latency); every op and the copies scale linearly with the batch, so the ratio the tuner
#: reads hardly depends on it, and the whole section (both dtypes, 8 timings per dtype twice, 2 copies) takes
#: seconds and under 1 GiB of GPU memory.
ATTENTION_BATCH = 8
ATTENTION_DTYPES = ("float32", "bfloat16")
#: BERT's attention-probability dropout rate.
ATTENTION_DROPOUT = 0.1
#: The chain, in order: the probe's name of each op, what PyTorch runs for it, and the TensorFlow ops a Keras 3 model
#: traces for it (``ops.matmul(q, ops.transpose(k))`` is a BatchMatMulV2; the scale a Mul by a scalar; Keras 3's
#: dropout is ``tf.nn.experimental.stateless_dropout``: a StatelessRandomUniformV2, a GreaterEqual mask, x times
#: 1 / (1 - rate), and a SelectV2 of that and 0). ``tf.random.stateless_uniform`` traces a Mul by 1 and an AddV2 of 0
#: after the uniform (x * (max - min) + min); grappler's constant folding removes both before the step runs (in
#: the kit's BERT traced through ``tflms.ir.preoptimize``, the uniform feeds the GreaterEqual), so only the uniform
#: is priced. ``tools/compare_profile.py`` names each traced op after the probe's name and prices the TensorFlow ops
#: listed here. The dropout's output is what a recompute of it re-runs the whole chain for.
ATTENTION_OPS = (
    ("scores", "torch.matmul(q, k.transpose(-1, -2))", ("BatchMatMulV2",)),
    ("scale", "scores * head_size ** -0.5", ("Mul",)),
    ("softmax", "torch.softmax(scaled, dim=-1)", ("Softmax",)),
    ("uniform", "torch.rand(batch, heads, sequence, sequence)", ("StatelessRandomUniformV2",)),
    ("mask", "uniform >= rate", ("GreaterEqual",)),
    ("rescale", "probs * (1 / (1 - rate))", ("Mul",)),
    ("select", "torch.where(mask, rescaled, 0)", ("SelectV2",)),
)


class Backend(Protocol):
    """What the probe needs from a GPU library; every time is seconds for one run, a median over ``repeats``."""

    name: str

    def device(self) -> dict[str, Any]: ...

    def copy_s(self, nbytes: int, direction: str, host: str, repeats: int) -> float: ...

    def both_directions_s(self, nbytes: int, host: str, repeats: int) -> float: ...

    def matmul_s(self, n: int, mode: str, repeats: int) -> float: ...

    def copy_during_matmul_s(self, nbytes: int, direction: str, n: int, mode: str,
                             repeats: int) -> tuple[float, float]: ...

    def conv_s(self, shape: tuple[int, int, int, int, int], dtype: str, repeats: int) -> float | None: ...

    def device_copy_s(self, nbytes: int, repeats: int) -> float: ...

    def conv_train_s(self, shape: tuple[int, int, int, int, int], dtype: str, layout: str,
                     repeats: int) -> tuple[float, float] | None:
        """A convolution's forward and backward (input and filter gradients) times, or ``None``."""

    def elementwise_s(self, op: str, shape: tuple[int, ...], dtype: str, repeats: int) -> float | None:
        """One element-wise op (:data:`ELEMENTWISE_OPS`) on a tensor of ``shape``, or ``None``."""

    def batchnorm_train_s(self, shape: tuple[int, int, int], dtype: str, layout: str,
                          repeats: int) -> tuple[float, float] | None:
        """Training-mode batch normalisation of a (batch, channels, side, side) activation: the forward's time
        (batch statistics, running statistics updated, normalised output) and the backward's (input, weight and
        bias gradients from a fixed upstream gradient), or ``None``."""

    def batchnorm_details(self) -> dict[str, Any]:
        """How :meth:`batchnorm_train_s` measured (``params_dtype``: the dtype of the weight, bias and running
        statistics each activation dtype and layout, as ``"bfloat16 nhwc"``, ran with; ``timing``), for the JSON."""

    def attention_s(self, shape: tuple[int, int, int, int], dtype: str, rate: float,
                    repeats: int) -> dict[str, float] | None:
        """BERT's attention-probability chain (:data:`ATTENTION_OPS`) on Q and K of ``shape`` (batch, heads,
        sequence, head size) with dropout ``rate``: seconds of each op alone, keyed by its name, and of the whole
        chain run back to back (``chain``); or ``None``."""

    def attention_details(self) -> dict[str, Any]:
        """How :meth:`attention_s` measured (``timing``, ``float32_products``), for the JSON."""


def _median(times: list[float]) -> float:
    return statistics.median(times)


class TorchBackend:
    """PyTorch's CUDA runtime: streams, events, pinned host tensors, cuBLAS and cuDNN."""

    name = "pytorch"

    def __init__(self) -> None:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch sees no CUDA GPU (torch.cuda.is_available() is False)")
        self.torch = torch
        self.dev = torch.device("cuda")
        self.batchnorm_params: dict[str, str] = {}

    def device(self) -> dict[str, Any]:
        torch = self.torch
        props = torch.cuda.get_device_properties(0)
        return {"name": props.name, "memory_bytes": int(props.total_memory),
                "multiprocessors": props.multi_processor_count, "compute_capability": f"{props.major}.{props.minor}",
                "driver": _nvidia_smi_driver(), "cuda_runtime": torch.version.cuda, "library": f"torch {torch.__version__}"}

    def _timed(self, launch: Callable[[], None], repeats: int, stream=None, queued: bool = False) -> float:
        """With ``queued``, each timed launch waits on the GPU behind a sleep of :data:`QUEUE_CYCLES` (queued
        first), so the events time the GPU's work even where PyTorch takes longer to launch it than the GPU to
        run it (a small batch norm, an autograd backward)."""
        torch = self.torch
        sleep = getattr(torch.cuda, "_sleep", None) if queued else None
        launch()
        torch.cuda.synchronize()
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if sleep is not None:
                sleep(QUEUE_CYCLES)
            start.record(stream)
            launch()
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        torch.cuda.synchronize()
        return _median(times)

    def _dtype(self, name: str):
        """The torch dtype the probe's dtype names (``float32``, ``bfloat16``, ``float16``) stand for."""
        torch = self.torch
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]

    def _host(self, nbytes: int, host: str):
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=host == "pinned")

    def _pair(self, nbytes: int, direction: str, host: str):
        h, d = self._host(nbytes, host), self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)
        return (d, h) if direction == "h2d" else (h, d)

    def copy_s(self, nbytes: int, direction: str, host: str, repeats: int) -> float:
        dst, src = self._pair(nbytes, direction, host)
        return self._timed(lambda: dst.copy_(src, non_blocking=True), repeats)

    def both_directions_s(self, nbytes: int, host: str, repeats: int) -> float:
        torch = self.torch
        (d1, h1), (h2, d2) = self._pair(nbytes, "h2d", host), self._pair(nbytes, "d2h", host)
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

        def launch() -> None:
            ready = torch.cuda.current_stream().record_event()
            for stream, dst, src in ((s1, d1, h1), (s2, h2, d2)):
                stream.wait_event(ready)
                with torch.cuda.stream(stream):
                    dst.copy_(src, non_blocking=True)
            torch.cuda.current_stream().wait_stream(s1)
            torch.cuda.current_stream().wait_stream(s2)
        return self._timed(launch, repeats)

    def _matmul(self, n: int, mode: str):
        torch = self.torch
        dtype = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[mode]
        a = torch.randn(n, n, device=self.dev, dtype=dtype)
        b = torch.randn(n, n, device=self.dev, dtype=dtype)
        out = torch.empty(n, n, device=self.dev, dtype=dtype)
        tf32 = mode == "tf32"

        def launch() -> None:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.matmul(a, b, out=out)
        return launch

    def matmul_s(self, n: int, mode: str, repeats: int) -> float:
        try:
            return self._timed(self._matmul(n, mode), repeats)
        finally:
            self.torch.backends.cuda.matmul.allow_tf32 = False

    def copy_during_matmul_s(self, nbytes: int, direction: str, n: int, mode: str,
                             repeats: int) -> tuple[float, float]:
        torch = self.torch
        dst, src = self._pair(nbytes, direction, "pinned")
        product = self._matmul(n, mode)
        copy_stream, compute_stream = torch.cuda.Stream(), torch.cuda.Stream()
        copy_times, product_times = [], []
        try:
            for i in range(repeats + 1):
                torch.cuda.synchronize()
                events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                with torch.cuda.stream(compute_stream):
                    events[0].record(compute_stream)
                    product()
                    events[1].record(compute_stream)
                with torch.cuda.stream(copy_stream):
                    events[2].record(copy_stream)
                    dst.copy_(src, non_blocking=True)
                    events[3].record(copy_stream)
                torch.cuda.synchronize()
                if i:  # the first is the warm-up
                    product_times.append(events[0].elapsed_time(events[1]) / 1e3)
                    copy_times.append(events[2].elapsed_time(events[3]) / 1e3)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
        return _median(copy_times), _median(product_times)

    def conv_s(self, shape: tuple[int, int, int, int, int], dtype: str, repeats: int) -> float | None:
        torch = self.torch
        batch, c_in, c_out, hw, k = shape
        dt = self._dtype(dtype)
        x = torch.randn(batch, c_in, hw, hw, device=self.dev, dtype=dt)
        w = torch.randn(c_out, c_in, k, k, device=self.dev, dtype=dt)
        torch.backends.cudnn.benchmark = True
        return self._timed(lambda: torch.nn.functional.conv2d(x, w, padding=k // 2), repeats)

    def conv_train_s(self, shape: tuple[int, int, int, int, int], dtype: str, layout: str,
                     repeats: int) -> tuple[float, float] | None:
        torch = self.torch
        batch, c_in, c_out, hw, k = shape
        dt = self._dtype(dtype)
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        x = torch.randn(batch, c_in, hw, hw, device=self.dev, dtype=dt).to(memory_format=fmt).requires_grad_()
        w = torch.randn(c_out, c_in, k, k, device=self.dev, dtype=dt).to(memory_format=fmt).requires_grad_()
        torch.backends.cudnn.benchmark = True
        forward = self._timed(lambda: torch.nn.functional.conv2d(x, w, padding=k // 2), repeats)
        y = torch.nn.functional.conv2d(x, w, padding=k // 2)
        dy = torch.randn_like(y)
        both = self._timed(lambda: torch.autograd.grad(torch.nn.functional.conv2d(x, w, padding=k // 2), (x, w), dy),
                           repeats)
        return forward, max(both - forward, 0.0)

    def elementwise_s(self, op: str, shape: tuple[int, ...], dtype: str, repeats: int) -> float | None:
        torch = self.torch
        dt = self._dtype(dtype)
        x = torch.randn(*shape, device=self.dev, dtype=dt)
        y = torch.randn(*shape, device=self.dev, dtype=dt)
        launch = {"relu": lambda: torch.relu(x), "add": lambda: x + y, "mul": lambda: x * 0.5,
                  "sum": lambda: x.sum(dim=(0, 1, 2))}[op]
        return self._timed(launch, repeats)

    def _batchnorm(self, shape: tuple[int, int, int], dtype: str, layout: str, params: str):
        """An activation (``requires_grad``), weight and bias (``requires_grad``, in ``params``), and the
        training-mode forward over them (running mean and variance in ``params``, updated in place)."""
        torch = self.torch
        batch, channels, side = shape
        fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        x = torch.randn(batch, channels, side, side, device=self.dev, dtype=self._dtype(dtype))
        x = x.to(memory_format=fmt).requires_grad_()
        p = self._dtype(params)
        weight = torch.ones(channels, device=self.dev, dtype=p, requires_grad=True)
        bias = torch.zeros(channels, device=self.dev, dtype=p, requires_grad=True)
        mean, var = torch.zeros(channels, device=self.dev, dtype=p), torch.ones(channels, device=self.dev, dtype=p)
        return x, weight, bias, lambda: torch.nn.functional.batch_norm(x, mean, var, weight, bias, training=True,
                                                                         momentum=0.1, eps=1e-5)

    def batchnorm_train_s(self, shape: tuple[int, int, int], dtype: str, layout: str,
                          repeats: int) -> tuple[float, float] | None:
        """A bfloat16 activation runs with float32 weight, bias and running statistics (cuDNN's mixed batch norm,
        as autocast and TensorFlow's FusedBatchNormV3 run it) where PyTorch accepts that, else all in bfloat16;
        the first shape of each dtype and layout decides, and :meth:`batchnorm_details` says which. The backward
        is timed alone: ``torch.autograd.grad`` of the input, weight and bias on a forward graph kept for every
        repeat (``retain_graph``), so each run is the backward kernels a training step runs after that forward.
        Each time is the lesser of the queued and the plain measurement (:meth:`_timed`): queued, a launch that
        synchronised would count the sleep."""
        torch = self.torch
        key = f"{dtype} {layout}"
        choices = [self.batchnorm_params[key]] if key in self.batchnorm_params else (
            ["float32", dtype] if dtype != "float32" else ["float32"])
        for i, params in enumerate(choices):
            try:
                x, weight, bias, forward = self._batchnorm(shape, dtype, layout, params)
                y = forward()
                dy = torch.randn_like(y)
                torch.autograd.grad(y, (x, weight, bias), dy)
                torch.cuda.synchronize()
                break
            except Exception:  # mixed dtypes refused (or anything else): the next choice
                if i == len(choices) - 1:
                    raise
        self.batchnorm_params[key] = params
        forward_s = min(self._timed(forward, repeats, queued=True), self._timed(forward, repeats))
        y = forward()

        def backward() -> None:
            torch.autograd.grad(y, (x, weight, bias), dy, retain_graph=True)
        backward_s = min(self._timed(backward, repeats, queued=True), self._timed(backward, repeats))
        return forward_s, backward_s

    def batchnorm_details(self) -> dict[str, Any]:
        return {"params_dtype": dict(self.batchnorm_params),
                "timing": "torch.nn.functional.batch_norm(training=True), then torch.autograd.grad on its kept "
                          f"graph; CUDA events around each run, median; {self._queued_note()}"}

    def _queued_note(self) -> str:
        return (f"the lesser of: each run queued behind a {QUEUE_CYCLES}-cycle GPU sleep (the GPU's time, not "
                "PyTorch's launch overhead), and each run alone" if hasattr(self.torch.cuda, "_sleep")
                else "each run alone (no torch.cuda._sleep: launch overhead included where it exceeds the GPU's)")

    def attention_s(self, shape: tuple[int, int, int, int], dtype: str, rate: float,
                    repeats: int) -> dict[str, float] | None:
        """Each op of :data:`ATTENTION_OPS` alone on the previous op's output (computed once, outside the timing),
        then the chain back to back from Q and K (each op allocating its output, as TensorFlow's kernels do).
        A float32 product runs as TF32 (TensorFlow's default on this GPU, what the cost model prices). Each time is
        the lesser of the queued and the plain measurement (:meth:`_timed`), as for batch norm."""
        torch = self.torch
        batch, heads, seq, size = shape
        dt = self._dtype(dtype)
        q = torch.randn(batch, heads, seq, size, device=self.dev, dtype=dt)
        k = torch.randn(batch, heads, seq, size, device=self.dev, dtype=dt)
        zero = torch.zeros((), device=self.dev, dtype=dt)
        scale, keep = size ** -0.5, 1.0 / (1.0 - rate)

        def scores():
            return torch.matmul(q, k.transpose(-1, -2))

        def uniform():
            return torch.rand(batch, heads, seq, seq, device=self.dev, dtype=dt)

        def chain():
            probs = torch.softmax(scores() * scale, dim=-1)
            return torch.where(uniform() >= rate, probs * keep, zero)

        torch.backends.cuda.matmul.allow_tf32 = dtype == "float32"
        try:
            s = scores()
            scaled = s * scale
            probs = torch.softmax(scaled, dim=-1)
            u = uniform()
            mask = u >= rate
            rescaled = probs * keep
            launches = {"scores": scores, "scale": lambda: s * scale, "softmax": lambda: torch.softmax(scaled, dim=-1),
                        "uniform": uniform, "mask": lambda: u >= rate, "rescale": lambda: probs * keep,
                        "select": lambda: torch.where(mask, rescaled, zero), "chain": chain}
            assert list(launches)[:-1] == [name for name, _, _ in ATTENTION_OPS]
            return {name: min(self._timed(launch, repeats, queued=True), self._timed(launch, repeats))
                    for name, launch in launches.items()}
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False

    def attention_details(self) -> dict[str, Any]:
        return {"float32_products": "TF32 (torch.backends.cuda.matmul.allow_tf32, as TensorFlow runs float32 "
                                    "products by default)",
                "timing": "each op alone on the previous op's output, then the chain back to back from Q and K; "
                          f"CUDA events around each run, median; {self._queued_note()}; host copies: copy_s "
                          "(pinned, one direction at a time) of the chain's tensor's bytes"}

    def device_copy_s(self, nbytes: int, repeats: int) -> float:
        src = self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.dev)
        dst = self.torch.empty_like(src)
        return self._timed(lambda: dst.copy_(src), repeats)


class CupyBackend:
    """CuPy: the same measurements without a deep-learning framework (no convolution)."""

    name = "cupy"

    def __init__(self) -> None:
        import cupy
        import numpy
        if cupy.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("CuPy sees no CUDA GPU")
        self.cp, self.np = cupy, numpy

    def device(self) -> dict[str, Any]:
        cp = self.cp
        props = cp.cuda.runtime.getDeviceProperties(0)
        name = props["name"]
        return {"name": name.decode() if isinstance(name, bytes) else name, "memory_bytes": int(props["totalGlobalMem"]),
                "multiprocessors": props["multiProcessorCount"],
                "compute_capability": f"{props['major']}.{props['minor']}", "driver": _nvidia_smi_driver(),
                "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(), "library": f"cupy {cp.__version__}"}

    def _timed(self, launch: Callable[[], None], repeats: int, stream=None) -> float:
        cp = self.cp
        stream = stream or cp.cuda.get_current_stream()
        launch()
        stream.synchronize()
        times = []
        for _ in range(repeats):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record(stream)
            launch()
            end.record(stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        return _median(times)

    def _host(self, nbytes: int, host: str):
        if host == "pinned":
            mem = self.cp.cuda.alloc_pinned_memory(nbytes)
            return self.np.frombuffer(mem, self.np.uint8, nbytes)
        return self.np.empty(nbytes, self.np.uint8)

    def copy_s(self, nbytes: int, direction: str, host: str, repeats: int) -> float:
        cp = self.cp
        h, d = self._host(nbytes, host), cp.empty(nbytes, cp.uint8)
        stream = cp.cuda.Stream(non_blocking=True)
        if direction == "h2d":
            return self._timed(lambda: d.set(h, stream=stream), repeats, stream)
        return self._timed(lambda: d.get(stream=stream, out=h), repeats, stream)

    def both_directions_s(self, nbytes: int, host: str, repeats: int) -> float:
        cp = self.cp
        h1, d1 = self._host(nbytes, host), cp.empty(nbytes, cp.uint8)
        h2, d2 = self._host(nbytes, host), cp.empty(nbytes, cp.uint8)
        s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
        times = []
        for i in range(repeats + 1):
            cp.cuda.Device().synchronize()
            start, end1, end2 = cp.cuda.Event(), cp.cuda.Event(), cp.cuda.Event()
            start.record(s1)
            s2.wait_event(start)
            d1.set(h1, stream=s1)
            d2.get(stream=s2, out=h2)
            end1.record(s1)
            end2.record(s2)
            cp.cuda.Device().synchronize()
            if i:
                times.append(max(cp.cuda.get_elapsed_time(start, end1), cp.cuda.get_elapsed_time(start, end2)) / 1e3)
        return _median(times)

    def _matmul(self, n: int, mode: str):
        cp = self.cp
        if mode == "tf32":
            raise NotImplementedError("CuPy decides TF32 once, at import (CUPY_TF32=1); use --backend pytorch")
        dtype = {"fp32": cp.float32, "fp16": cp.float16, "bf16": None}[mode]
        if dtype is None:
            raise NotImplementedError("CuPy has no bfloat16 matrix product")
        a, b = cp.random.standard_normal((n, n)).astype(dtype), cp.random.standard_normal((n, n)).astype(dtype)
        out = cp.empty((n, n), dtype)
        return lambda: cp.matmul(a, b, out=out)

    def matmul_s(self, n: int, mode: str, repeats: int) -> float:
        return self._timed(self._matmul(n, mode), repeats)

    def copy_during_matmul_s(self, nbytes: int, direction: str, n: int, mode: str,
                             repeats: int) -> tuple[float, float]:
        cp = self.cp
        h, d = self._host(nbytes, "pinned"), cp.empty(nbytes, cp.uint8)
        product = self._matmul(n, mode)
        copy_stream, compute_stream = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
        copy_times, product_times = [], []
        for i in range(repeats + 1):
            cp.cuda.Device().synchronize()
            events = [cp.cuda.Event() for _ in range(4)]
            with compute_stream:
                events[0].record(compute_stream)
                product()
                events[1].record(compute_stream)
            events[2].record(copy_stream)
            if direction == "h2d":
                d.set(h, stream=copy_stream)
            else:
                d.get(stream=copy_stream, out=h)
            events[3].record(copy_stream)
            cp.cuda.Device().synchronize()
            if i:
                product_times.append(cp.cuda.get_elapsed_time(events[0], events[1]) / 1e3)
                copy_times.append(cp.cuda.get_elapsed_time(events[2], events[3]) / 1e3)
        return _median(copy_times), _median(product_times)

    def conv_s(self, shape: tuple[int, int, int, int, int], dtype: str, repeats: int) -> float | None:
        return None  # CuPy's cuDNN bindings are optional; the table says "not measured"

    def conv_train_s(self, shape: tuple[int, int, int, int, int], dtype: str, layout: str,
                     repeats: int) -> tuple[float, float] | None:
        return None

    def elementwise_s(self, op: str, shape: tuple[int, ...], dtype: str, repeats: int) -> float | None:
        return None

    def batchnorm_train_s(self, shape: tuple[int, int, int], dtype: str, layout: str,
                          repeats: int) -> tuple[float, float] | None:
        return None  # as for convolutions: no cuDNN here

    def batchnorm_details(self) -> dict[str, Any]:
        return {}

    def attention_s(self, shape: tuple[int, int, int, int], dtype: str, rate: float,
                    repeats: int) -> dict[str, float] | None:
        return None  # no softmax, bfloat16 or Philox uniform here: --attention needs PyTorch

    def attention_details(self) -> dict[str, Any]:
        return {}

    def device_copy_s(self, nbytes: int, repeats: int) -> float:
        src = self.cp.empty(nbytes, self.cp.uint8)
        dst = self.cp.empty_like(src)
        return self._timed(lambda: dst.__setitem__(Ellipsis, src), repeats)


@dataclasses.dataclass
class StandInBackend:
    """A GPU described by its rates, for the probe's tests: each time is what those rates give.

    ``overlap_slowdown`` is how much longer a pinned copy takes while a product runs (1.0: no
    contention); pageable copies run at ``pageable_fraction`` of the pinned rate.
    """

    name: str = "stand-in"
    device_name: str = "Stand-in GPU"
    memory_bytes: int = 80 * GIB
    h2d_gbps: float = 50.0
    d2h_gbps: float = 40.0
    both_fraction: float = 0.8
    pageable_fraction: float = 0.5
    flops: dict[str, float] = dataclasses.field(default_factory=lambda: {
        "fp32": 50e12, "tf32": 380e12, "fp16": 750e12, "bf16": 750e12})
    hbm_gbps: float = 3000.0
    overlap_slowdown: float = 1.1
    latency_s: float = 10e-6

    def device(self) -> dict[str, Any]:
        return {"name": self.device_name, "memory_bytes": self.memory_bytes, "multiprocessors": 132,
                "compute_capability": "9.0", "driver": "stand-in", "cuda_runtime": "stand-in", "library": "none"}

    def _link(self, direction: str, host: str) -> float:
        gbps = self.h2d_gbps if direction == "h2d" else self.d2h_gbps
        return gbps * 1e9 * (self.pageable_fraction if host == "pageable" else 1.0)

    def copy_s(self, nbytes: int, direction: str, host: str, repeats: int) -> float:
        return self.latency_s + nbytes / self._link(direction, host)

    def both_directions_s(self, nbytes: int, host: str, repeats: int) -> float:
        return max(self.copy_s(nbytes, d, host, repeats) for d in ("h2d", "d2h")) / self.both_fraction

    def matmul_s(self, n: int, mode: str, repeats: int) -> float:
        return 2 * n**3 / self.flops[mode]

    def copy_during_matmul_s(self, nbytes: int, direction: str, n: int, mode: str,
                             repeats: int) -> tuple[float, float]:
        return self.copy_s(nbytes, direction, "pinned", repeats) * self.overlap_slowdown, self.matmul_s(n, mode, repeats)

    def conv_s(self, shape: tuple[int, int, int, int, int], dtype: str, repeats: int) -> float | None:
        return conv_flops(shape) / self.flops["fp32" if dtype == "float32" else "bf16"]

    def device_copy_s(self, nbytes: int, repeats: int) -> float:
        return 2 * nbytes / (self.hbm_gbps * 1e9)

    def conv_train_s(self, shape: tuple[int, int, int, int, int], dtype: str, layout: str,
                     repeats: int) -> tuple[float, float] | None:
        forward = self.conv_s(shape, dtype, repeats) * (1.0 if layout == "nhwc" else 1.5)
        return forward, 2 * forward

    def elementwise_s(self, op: str, shape: tuple[int, ...], dtype: str, repeats: int) -> float | None:
        return elementwise_bytes(op, shape, dtype) / (self.hbm_gbps * 1e9)

    def batchnorm_train_s(self, shape: tuple[int, int, int], dtype: str, layout: str,
                          repeats: int) -> tuple[float, float] | None:
        """:func:`batchnorm_bytes` at the HBM rate, channels-last; channels-first 1.25x slower."""
        slower = 1.0 if layout == "nhwc" else 1.25
        return tuple(batchnorm_bytes(shape, dtype, which) / (self.hbm_gbps * 1e9) * slower
                     for which in ("forward", "backward"))

    def batchnorm_details(self) -> dict[str, Any]:
        return {"params_dtype": {f"{dtype} {layout}": "float32" for dtype in BATCHNORM_DTYPES
                                 for layout in CONV_LAYOUTS},
                "timing": "stand-in: batchnorm_bytes at hbm_gbps"}

    def attention_s(self, shape: tuple[int, int, int, int], dtype: str, rate: float,
                    repeats: int) -> dict[str, float] | None:
        """Each op the longer of :func:`attention_bytes` at the HBM rate and :func:`attention_flops` at the product
        rate of its dtype (float32 as TF32); the chain the sum of its ops."""
        mode = "tf32" if dtype == "float32" else "bf16"
        times = {name: max(attention_bytes(name, shape, dtype) / (self.hbm_gbps * 1e9),
                           attention_flops(name, shape) / self.flops[mode]) for name, _, _ in ATTENTION_OPS}
        return {**times, "chain": sum(times.values())}

    def attention_details(self) -> dict[str, Any]:
        return {"timing": "stand-in: attention_bytes at hbm_gbps, attention_flops at the tf32 / bf16 rate"}


def elementwise_bytes(op: str, shape: tuple[int, ...], dtype: str) -> int:
    """Bytes an element-wise op reads and writes: ``add`` reads two tensors, ``sum`` writes one per channel."""
    elements = 1
    for d in shape:
        elements *= d
    size = 4 if dtype == "float32" else 2
    reads = 2 if op == "add" else 1
    written = shape[-1] if op == "sum" else elements
    return (reads * elements + written) * size


def batchnorm_bytes(shape: tuple[int, int, int], dtype: str, which: str) -> int:
    """Bytes a minimal training-mode batch norm of a (batch, channels, side, side) activation moves, counting
    activation-sized tensors only (the per-channel weight, bias, statistics and their gradients, a few KiB, are
    left out). ``forward``: reads x twice (the batch statistics, then normalising) and writes y, 3 tensors;
    ``backward``: reads x and dy twice (the per-channel sums of dy and dy * x-hat, then dx) and writes dx,
    5 tensors. A tensor is batch x channels x side x side elements of 4 bytes (float32) or 2 (bfloat16)."""
    batch, channels, side = shape
    size = 4 if dtype == "float32" else 2
    return {"forward": 3, "backward": 5}[which] * batch * channels * side * side * size


def attention_tensor_bytes(shape: tuple[int, int, int, int], dtype: str) -> int:
    """Bytes of one (batch, heads, sequence, sequence) tensor of the attention chain (the softmax's or the dropout's
    output, what a swap copies out and back) for Q and K of ``shape`` (batch, heads, sequence, head size)."""
    batch, heads, seq, _ = shape
    return batch * heads * seq * seq * (4 if dtype == "float32" else 2)


def attention_bytes(op: str, shape: tuple[int, int, int, int], dtype: str) -> int:
    """Bytes an op of :data:`ATTENTION_OPS` reads and writes, unfused (one kernel per op, as PyTorch runs them):
    ``scores`` reads Q and K and writes the scores; ``uniform`` writes one tensor; ``mask`` reads one and writes a
    bool (1 byte an element); ``select`` reads the mask and one tensor and writes one; the rest read one and write
    one. A tensor of the chain is :func:`attention_tensor_bytes`."""
    batch, heads, seq, size = shape
    width = 4 if dtype == "float32" else 2
    tensor, elements = attention_tensor_bytes(shape, dtype), batch * heads * seq * seq
    return {"scores": 2 * batch * heads * seq * size * width + tensor, "scale": 2 * tensor, "softmax": 2 * tensor,
            "uniform": tensor, "mask": tensor + elements, "rescale": 2 * tensor,
            "select": elements + 2 * tensor}[op]


def attention_flops(op: str, shape: tuple[int, int, int, int]) -> float:
    """Multiply-adds x 2 of the ``scores`` product (Q times K transposed); 0 for the chain's other ops."""
    batch, heads, seq, size = shape
    return 2.0 * batch * heads * seq * seq * size if op == "scores" else 0.0


def batchnorm_best(layers: list[dict[str, Any]]) -> dict[tuple[str, tuple[int, ...]], dict[str, Any]]:
    """Per (dtype, shape), the measured ``--batchnorm`` layer at its faster layout (least forward + backward
    time); layers that recorded an error are left out."""
    best: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
    for layer in layers:
        if layer.get("error"):
            continue
        key = (layer["dtype"], tuple(layer["shape"]))
        seconds = layer["forward_s"] + layer["backward_s"]
        if key not in best or seconds < best[key]["forward_s"] + best[key]["backward_s"]:
            best[key] = layer
    return best


def conv_flops(shape: tuple[int, int, int, int, int]) -> float:
    """Multiply-adds x 2 of a stride-1 'same' convolution."""
    batch, c_in, c_out, hw, k = shape
    return 2.0 * batch * hw * hw * c_out * c_in * k * k


def _nvidia_smi_driver() -> str:
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def probe(backend: Backend, *, copy_bytes: int = 256 * MIB, matmul_n: int = 8192, repeats: int = 10,
          conv_layers: bool = False, elementwise: bool = False, batchnorm: bool = False, attention: bool = False,
          attention_batch: int = ATTENTION_BATCH, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """Every measurement, as rates: GB/s (1e9 bytes/s) and FLOP/s; with ``conv_layers``, also a training
    step's convolutions (:func:`measure_conv_layers`); with ``elementwise``, element-wise ops (bytes read and
    written per second, :data:`ELEMENTWISE_OPS`); with ``batchnorm``, training-mode batch norms
    (:func:`measure_batchnorm`); with ``attention``, BERT's attention chain and its tensor's host copies at
    ``attention_batch`` (:func:`measure_attention`)."""
    out: dict[str, Any] = {"copy_bytes": copy_bytes, "matmul_n": matmul_n, "repeats": repeats}
    link = out["link_gbps"] = {}
    for host in ("pinned", "pageable"):
        for direction in ("h2d", "d2h"):
            progress(f"{direction} copy, {host}")
            link[f"{direction}_{host}"] = copy_bytes / backend.copy_s(copy_bytes, direction, host, repeats) / 1e9
        progress(f"both directions at once, {host}")
        link[f"both_{host}"] = 2 * copy_bytes / backend.both_directions_s(copy_bytes, host, repeats) / 1e9
    rates = out["matmul_flops"] = {}
    for mode in MATMUL_MODES:
        progress(f"{matmul_n}^3 matrix product, {mode}")
        try:
            rates[mode] = 2 * matmul_n**3 / backend.matmul_s(matmul_n, mode, repeats)
        except NotImplementedError as err:
            rates[mode] = None
            out.setdefault("not_measured", {})[f"matmul_{mode}"] = str(err)
    overlap = out["overlap"] = {}
    mode = "bf16" if rates.get("bf16") else "fp16"
    for direction in ("h2d", "d2h"):
        progress(f"{direction} copy during a {mode} product")
        copy_s, product_s = backend.copy_during_matmul_s(copy_bytes, direction, matmul_n, mode, repeats)
        overlap[direction] = {"product": mode, "copy_gbps": copy_bytes / copy_s / 1e9,
                              "copy_vs_alone": link[f"{direction}_pinned"] / (copy_bytes / copy_s / 1e9),
                              "product_flops": 2 * matmul_n**3 / product_s,
                              "product_vs_alone": rates[mode] / (2 * matmul_n**3 / product_s)}
    conv = out["conv_flops"] = {}
    for dtype in ("float32", "bfloat16"):
        progress(f"convolution {CONV_SHAPE}, {dtype}")
        seconds = backend.conv_s(CONV_SHAPE, dtype, repeats)
        conv[dtype] = None if seconds is None else conv_flops(CONV_SHAPE) / seconds
    progress("device-to-device copy")
    out["hbm_gbps"] = 2 * copy_bytes / backend.device_copy_s(copy_bytes, repeats) / 1e9
    if conv_layers:
        progress(f"{len(RESNET50_CONVS)} ResNet-50 convolutions, forward and backward")
        out["conv_layers"] = measure_conv_layers(backend, repeats)
    if elementwise:
        progress(f"element-wise ops on {ELEMENTWISE_SHAPE}")
        rates: dict[str, Any] = {"shape": list(ELEMENTWISE_SHAPE)}
        for dtype in ("float32", "bfloat16"):
            for op in ELEMENTWISE_OPS:
                seconds = backend.elementwise_s(op, ELEMENTWISE_SHAPE, dtype, repeats)
                rates[f"{op} {dtype}"] = (None if seconds is None
                                          else elementwise_bytes(op, ELEMENTWISE_SHAPE, dtype) / seconds / 1e9)
        out["elementwise_gbps"] = rates
    if batchnorm:
        progress(f"batch norm on {len(RESNET50_BATCHNORMS)} ResNet-50 activations, forward and backward")
        out["batchnorm"] = measure_batchnorm(backend, repeats)
    if attention:
        progress(f"BERT's attention chain at batch {attention_batch}, sequence {ATTENTION_SEQUENCE}, and its copies")
        out["attention"] = measure_attention(backend, repeats, attention_batch)
    return out


def measure_attention(backend: Backend, repeats: int, batch: int = ATTENTION_BATCH) -> dict[str, Any]:
    """BERT-base's attention chain (:data:`ATTENTION_OPS`) at ``batch`` in float32 and bfloat16: per dtype, each
    op's seconds alone (and GB/s of :func:`attention_bytes`; the product's FLOP/s too), the chain's back to back
    (``chain_s``: what a recompute of the dropout's output re-runs), the pinned host copies of one chain tensor
    (:func:`attention_tensor_bytes`) out and back, timed by the backend's ``copy_s`` as the link figures are, and
    ``recompute_over_copy``: ``chain_s`` over ``d2h_s + h2d_s``, the ratio Capuchin's rule compares with 1 (below:
    recompute). A dtype whose measurement fails records ``error`` and the probe goes on."""
    shape = (batch, ATTENTION_HEADS, ATTENTION_SEQUENCE, ATTENTION_HEAD_SIZE)
    dtypes: dict[str, Any] = {}
    for dtype in ATTENTION_DTYPES:
        entry: dict[str, Any] = dtypes.setdefault(dtype, {})
        try:
            times = backend.attention_s(shape, dtype, ATTENTION_DROPOUT, repeats)
            if times is None:
                return {"not_measured": f"{backend.name} has no attention chain (--attention needs --backend pytorch)"}
            nbytes = attention_tensor_bytes(shape, dtype)
            d2h = backend.copy_s(nbytes, "d2h", "pinned", repeats)
            h2d = backend.copy_s(nbytes, "h2d", "pinned", repeats)
        except Exception as err:  # one dtype's failure is recorded, not the probe's end
            entry["error"] = f"{type(err).__name__}: {err}"[:500]
            continue
        ops = {}
        for name, _, _ in ATTENTION_OPS:
            seconds = times[name]
            ops[name] = {"seconds": seconds,
                         "gbps": attention_bytes(name, shape, dtype) / seconds / 1e9 if seconds else None}
            if attention_flops(name, shape):
                ops[name]["flops"] = attention_flops(name, shape) / seconds if seconds else None
        entry.update(ops=ops, chain_s=times["chain"], ops_sum_s=sum(op["seconds"] for op in ops.values()),
                     tensor_bytes=nbytes, d2h_s=d2h, h2d_s=h2d, copy_s=d2h + h2d,
                     recompute_over_copy=times["chain"] / (d2h + h2d))
    try:
        details = backend.attention_details()
    except Exception as err:  # the measurements are kept whatever this says
        details = {"details_error": f"{type(err).__name__}: {err}"}
    return {"shape": list(shape), "shapes": "Q and K: batch, heads, sequence, head size; every tensor of the chain "
                                            "(the copied one included): batch, heads, sequence, sequence",
            "dropout_rate": ATTENTION_DROPOUT, "ops": {name: torch for name, torch, _ in ATTENTION_OPS},
            "bytes": "GB/s counts each op's inputs read and output written once (attention_bytes); a mask is 1 "
                     "byte an element",
            **details, "dtypes": dtypes}


def measure_batchnorm(backend: Backend, repeats: int) -> dict[str, Any]:
    """Training-mode batch norm on ResNet-50's activations (:data:`RESNET50_BATCHNORMS`) in float32 and bfloat16,
    channels-first and channels-last: per layer, forward and backward seconds and GB/s (:func:`batchnorm_bytes`
    over the time). A layer whose measurement fails records ``error`` (its type and message) and the probe goes
    on."""
    layers = []
    for shape in RESNET50_BATCHNORMS:
        for dtype in BATCHNORM_DTYPES:
            for layout in CONV_LAYOUTS:
                layer: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "layout": layout}
                layers.append(layer)
                try:
                    times = backend.batchnorm_train_s(shape, dtype, layout, repeats)
                except Exception as err:  # one layer's failure is recorded, not the probe's end
                    layer["error"] = f"{type(err).__name__}: {err}"[:500]
                    continue
                if times is None:
                    return {"not_measured": f"{backend.name} has no batch normalisation"}
                forward, backward = times
                layer.update(forward_s=forward, backward_s=backward,
                             forward_gbps=batchnorm_bytes(shape, dtype, "forward") / forward / 1e9 if forward else None,
                             backward_gbps=(batchnorm_bytes(shape, dtype, "backward") / backward / 1e9 if backward
                                            else None))
    try:
        details = backend.batchnorm_details()
    except Exception as err:  # the measurements are kept whatever this says
        details = {"details_error": f"{type(err).__name__}: {err}"}
    return {"shapes": "batch, channels, height = width (training mode: batch statistics, running statistics "
                      "updated; backward: input, weight and bias gradients)",
            "bytes": "GB/s counts activation-sized tensors: forward reads x twice and writes y, backward reads x "
                     "and dy twice and writes dx (batchnorm_bytes)",
            **details, "layers": layers}


def measure_conv_layers(backend: Backend, repeats: int) -> dict[str, Any]:
    """ResNet-50's stride-1 convolutions (:data:`RESNET50_CONVS`) in float32 (TF32, as PyTorch and TensorFlow
    run them by default) and bfloat16, channels-first and channels-last: per layer, forward and backward rates
    (the backward pass is the input and filter gradients, twice the forward FLOPs); then, per dtype, the
    training rate over all layers at each layer's faster layout (what cuDNN's heuristics and TensorFlow's
    layout optimizer aim for): total FLOPs over total time."""
    layers, totals = [], {}
    for dtype in ("float32", "bfloat16"):
        flops_sum = seconds_sum = 0.0
        for shape in RESNET50_CONVS:
            best = None
            for layout in CONV_LAYOUTS:
                times = backend.conv_train_s(shape, dtype, layout, repeats)
                if times is None:
                    return {"not_measured": f"{backend.name} has no convolution"}
                forward, backward = times
                layers.append({"shape": list(shape), "dtype": dtype, "layout": layout,
                               "forward_flops": conv_flops(shape) / forward,
                               "backward_flops": 2 * conv_flops(shape) / backward if backward else None})
                step = forward + backward
                best = step if best is None else min(best, step)
            flops_sum += 3 * conv_flops(shape)
            seconds_sum += best
        totals[dtype] = flops_sum / seconds_sum
    return {"shapes": "batch, channels in, channels out, height = width, kernel (stride 1, 'same')",
            "layers": layers, "training_flops": totals}


def to_profile(device: dict[str, Any], measured: dict[str, Any], *, name: str | None = None) -> dict[str, Any]:
    """The measurements as :class:`tflms.profiles.HardwareProfile` fields (a JSON object tflms loads).

    Measured rates are what kernels reach, so every efficiency is 1: the simulator prices products at the
    measured rate of their math mode, memory traffic at the measured HBM copy, and host copies at the pinned
    link, per direction the slower of host-to-device and device-to-host (swap-outs and swap-ins both cross it).
    A rate the library could not measure is left out (the simulator then falls back as for a GPU without it).
    """
    rates = measured["matmul_flops"]
    link = measured["link_gbps"]
    label = name or "measured-" + "-".join(device["name"].lower().replace("nvidia", "").split())
    how = (f"measured by tools/gpu_probe.py on {device['name']} (driver {device['driver']}, {device['library']}), "
           f"median of {measured['repeats']}")
    profile = {
        "name": label,
        "memory_bytes": int(device["memory_bytes"]),
        "peak_flops": rates["fp32"],
        "memory_gbps": measured["hbm_gbps"],
        "link_gbps": min(link["h2d_pinned"], link["d2h_pinned"]),
        "compute_efficiency": 1.0,
        "link_efficiency": 1.0,
        "contraction_efficiency": 1.0,
        "memory_efficiency": 1.0,
        "description": (f"{how}: {measured['matmul_n']}^3 products, {measured['copy_bytes'] // MIB} MiB copies"),
        "sources": {"peak_flops": f"{how}: {measured['matmul_n']}^3 float32 product, TF32 off",
                    "memory_gbps": f"{how}: device-to-device copy, bytes read plus written",
                    "link_gbps": f"{how}: pinned host copies, the slower direction"},
    }
    for mode, field in (("tf32", "tf32_flops"), ("fp16", "fp16_flops"), ("bf16", "bf16_flops")):
        if rates.get(mode):
            profile[field] = rates[mode]
            profile["sources"][field] = f"{how}: {measured['matmul_n']}^3 {mode} product"
    return profile


def table(result: dict[str, Any]) -> str:
    m, dev = result["measurements"], result["device"]
    rows = [f"{dev['name']}: {dev['memory_bytes'] / GIB:.1f} GiB, driver {dev['driver']}, {dev['library']}"]
    link = m["link_gbps"]
    rows.append("host link (GB/s)      h2d     d2h    both")
    for host in ("pinned", "pageable"):
        rows.append(f"  {host:<18} {link[f'h2d_{host}']:7.1f} {link[f'd2h_{host}']:7.1f} {link[f'both_{host}']:7.1f}")
    rows.append("matrix products (TFLOP/s): " + ", ".join(
        f"{k} {'-' if v is None else f'{v / 1e12:.1f}'}" for k, v in m["matmul_flops"].items()))
    for direction, o in m["overlap"].items():
        rows.append(f"{direction} copy during a {o['product']} product: {o['copy_gbps']:.1f} GB/s "
                    f"({o['copy_vs_alone']:.2f}x the time alone); the product {o['product_vs_alone']:.2f}x its time alone")
    rows.append("convolution " + str(CONV_SHAPE) + " (TFLOP/s): " + ", ".join(
        f"{k} {'not measured' if v is None else f'{v / 1e12:.1f}'}" for k, v in m["conv_flops"].items()))
    rows.append(f"HBM (device-to-device copy, read + written): {m['hbm_gbps']:.0f} GB/s")
    layers = m.get("conv_layers")
    if layers and "training_flops" in layers:
        rows.append(f"ResNet-50's {len(RESNET50_CONVS)} stride-1 convolutions, forward + backward at the faster "
                    "layout (TFLOP/s): " + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in layers["training_flops"].items()))
    rates = m.get("elementwise_gbps")
    if rates:
        rows.append(f"element-wise ops on {tuple(rates['shape'])}, bytes read + written (GB/s): " + ", ".join(
            f"{k} {'-' if v is None else f'{v:.0f}'}" for k, v in rates.items() if k != "shape"))
    rows.extend(batchnorm_rows(m.get("batchnorm")))
    rows.extend(attention_rows(m.get("attention")))
    return "\n".join(rows)


def attention_rows(section: dict[str, Any] | None) -> list[str]:
    """The table's attention lines: per dtype, each op's and the chain's microseconds, the copies' and the ratio."""
    if not section:
        return []
    if "dtypes" not in section:
        return [f"attention: {section.get('not_measured', 'not measured')}"]
    batch, heads, seq, size = section["shape"]
    rows = [f"attention chain (batch {batch}, {heads} heads, sequence {seq}, head size {size}, dropout "
            f"{section['dropout_rate']}), microseconds; pinned copies of one {batch}x{heads}x{seq}x{seq} tensor:"]
    for dtype, entry in section["dtypes"].items():
        if entry.get("error"):
            rows.append(f"  {dtype}: failed: {entry['error']}")
            continue
        ops = " ".join(f"{name} {op['seconds'] * 1e6:.0f}" for name, op in entry["ops"].items())
        rows.append(f"  {dtype}: {ops}; chain {entry['chain_s'] * 1e6:.0f}; d2h {entry['d2h_s'] * 1e6:.0f} "
                    f"h2d {entry['h2d_s'] * 1e6:.0f} ({entry['tensor_bytes'] / MIB:.0f} MiB); recompute / copies "
                    f"{entry['recompute_over_copy']:.3f}")
    return rows


def batchnorm_rows(section: dict[str, Any] | None) -> list[str]:
    """The table's batch norm lines: per dtype, forward and backward GB/s over all shapes at each one's faster
    layout (total bytes over total time), and how many layers failed."""
    if not section:
        return []
    if "layers" not in section:
        return [f"batch norm: {section.get('not_measured', 'not measured')}"]
    totals: dict[str, list[float]] = {}
    for (dtype, shape), layer in batchnorm_best(section["layers"]).items():
        t = totals.setdefault(dtype, [0.0, 0.0, 0.0, 0.0])
        for i, which in enumerate(("forward", "backward")):
            t[2 * i] += batchnorm_bytes(shape, dtype, which)
            t[2 * i + 1] += layer[f"{which}_s"]
    rows = [f"batch norm (training) on ResNet-50's {len(RESNET50_BATCHNORMS)} activation shapes, faster layout, "
            "bytes a minimal kernel moves (GB/s): " + ", ".join(
                f"{dtype} forward {t[0] / t[1] / 1e9:.0f} backward {t[2] / t[3] / 1e9:.0f}" if t[1] and t[3]
                else f"{dtype} -" for dtype, t in totals.items())]
    failed = [layer for layer in section["layers"] if layer.get("error")]
    if failed:
        rows.append(f"batch norm: {len(failed)} of {len(section['layers'])} measurements failed, e.g. "
                    f"{tuple(failed[0]['shape'])} {failed[0]['dtype']} {failed[0]['layout']}: {failed[0]['error']}")
    return rows


def run(backend: Backend, **options: Any) -> dict[str, Any]:
    device = backend.device()
    name = options.pop("name", None)
    measured = probe(backend, **options)
    return {"tool": "tools/gpu_probe.py", "date": datetime.date.today().isoformat(), "backend": backend.name,
            "device": device, "measurements": measured, "profile": to_profile(device, measured, name=name)}


def emit(result: dict[str, Any], output: str | None, as_json: bool, as_table: Callable[[dict[str, Any]], str]) -> int:
    """Write ``result`` as JSON to ``output`` (if given) and print it, as JSON or as ``as_table`` renders it."""
    text = json.dumps(result, indent=2)
    if output:
        with open(output, "w") as f:
            f.write(text + "\n")
    print(text if as_json else as_table(result))
    return 0


def make_backend(choice: str) -> Backend:
    errors = []
    for name, cls in (("pytorch", TorchBackend), ("cupy", CupyBackend)):
        if choice not in ("auto", name):
            continue
        try:
            return cls()
        except (ImportError, RuntimeError) as err:
            errors.append(f"{name}: {err}")
    raise SystemExit("gpu_probe: no GPU library could reach a GPU (" + "; ".join(errors) + "); it needs an NVIDIA "
                     "GPU with PyTorch or CuPy installed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("auto", "pytorch", "cupy"), default="auto")
    parser.add_argument("--copy-mib", type=int, default=256, help="bytes per copy, MiB (default 256)")
    parser.add_argument("--matmul-n", type=int, default=8192, help="square matrix product size (default 8192)")
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per figure, median (default 10)")
    parser.add_argument("--name", help="the profile's name (default: measured-<device name>)")
    parser.add_argument("--conv-layers", action="store_true",
                        help="also time ResNet-50's convolutions, forward and backward, in both layouts")
    parser.add_argument("--elementwise", action="store_true",
                        help="also time element-wise ops (relu, add, mul, a per-channel sum) on an activation")
    parser.add_argument("--batchnorm", action="store_true",
                        help="also time training-mode batch norm on ResNet-50's activations, forward and backward, "
                             "in both layouts (PyTorch only)")
    parser.add_argument("--attention", action="store_true",
                        help="also time BERT-base's attention chain (scores, scale, softmax, dropout) op by op and "
                             "back to back, and the pinned host copies of its largest tensor, in float32 and "
                             "bfloat16 (PyTorch only)")
    parser.add_argument("--attention-batch", type=int, default=ATTENTION_BATCH,
                        help=f"batch of --attention's chain (default {ATTENTION_BATCH})")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument("-o", "--output", help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if args.copy_mib <= 0 or args.matmul_n <= 0 or args.repeats <= 0 or args.attention_batch <= 0:
        parser.error("--copy-mib, --matmul-n, --repeats and --attention-batch must be positive")
    backend = make_backend(args.backend)
    result = run(backend, copy_bytes=args.copy_mib * MIB, matmul_n=args.matmul_n, repeats=args.repeats,
                 conv_layers=args.conv_layers, elementwise=args.elementwise, batchnorm=args.batchnorm,
                 attention=args.attention, attention_batch=args.attention_batch, name=args.name,
                 progress=lambda what: print(f"measuring {what} ...", file=sys.stderr, flush=True))
    return emit(result, args.output, args.json, table)


if __name__ == "__main__":
    sys.exit(main())
