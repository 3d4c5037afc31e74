"""Whole training steps measured on a GPU, one process per figure: ``tools/gpu_step.py --whole-step`` (issue 46).

The bench's Keras models (tools/benchlib/models.py: ResNet-50, BERT-base; under ``mixed_bfloat16`` as the bench
builds its ``-amp-bf16`` rows) compiled by XLA through Keras 3's JAX backend (``compile(jit_compile=True)``,
``train_on_batch``), PyTorch beside them as a second reference, in float32 (TF32 products) and mixed bfloat16, and a
search for the largest ResNet-50 batch XLA trains, then 1.5x and 2x it. ``gpu_step.py``'s docstring says how to
run it; this module is its machinery:

- the parent (:func:`run`) imports no GPU library: it plans the cells, runs each in its own process
  (``gpu_step.py --cell``; a peak is a process's, so one process per figure), writes the JSON after every cell, and
  prints progress on stderr and a table at the end;
- :func:`run_cell` runs in that process: builds, warms up, times ``steps`` steps (median), reads the peak, and
  writes one row;
- :func:`search_largest` and :func:`bisect_batches` are the pure search (doubling from a start, then bisection).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

MODELS = ("resnet50", "bert-base")
FRAMEWORKS = ("keras", "torch")
DTYPES = ("float32", "bfloat16")
#: The bench's sizes (tools/benchlib/models.py): keras.applications ResNet50 at 224x224x3, build_bert's defaults.
SIZES = {"resnet50": {"side": 224},
         "bert-base": {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 30522, "seq_len": 512,
                       "dropout": 0.1, "classes": 2}}
BATCHES = {"resnet50": (128, 256), "bert-base": (32, 64)}
#: ``--dry-run``: the same models, small enough for a CPU.
DRY_SIZES = {"resnet50": {"side": 32},
             "bert-base": {"layers": 1, "hidden": 64, "heads": 2, "ffn": 128, "vocab": 1000, "seq_len": 16,
                           "dropout": 0.1, "classes": 2}}
DRY_BATCHES = {"resnet50": (2, 4), "bert-base": (2, 4)}
STATUSES = ("ok", "oom", "error", "unavailable", "skipped")
#: What an out-of-memory failure says, in JAX/XLA, TensorFlow and PyTorch.
OOM_PATTERN = re.compile(r"RESOURCE_EXHAUSTED|out of memory|OutOfMemory|ResourceExhausted|\bOOM\b", re.I)
#: Set for every cell's process unless the environment sets them: JAX takes memory as it needs it (one process per
#: figure; no preallocation) up to 95% of the GPU (JAX's default is 75%); JAX keeps compiled code in a cache the
#: run's processes share (the weights' initialisers compile once, not once per cell; a step compiled once more is
#: read back); TensorFlow's CPU allocator keeps stats (the dry run's peaks).
CHILD_ENV = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95",
             "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
             "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CPU_ALLOCATOR_USE_BFC": "1"}
#: The search's XLA flags: rematerialization never triggers (XLA:GPU's limit, gpu_hlo_schedule.cc
#: GetSchedulerMemoryLimit, is (0.8 x device memory - inputs and outputs) x slop / 100, slop 95 by default), so
#: the largest batch it finds is the largest whose step fits as written; the batches beyond it then run with the
#: environment's flags, where XLA may rematerialize: whether XLA alone trains past memory.
NO_REMAT_FLAGS = "--xla_gpu_memory_limit_slop_factor=10000"
#: Recorded in the JSON: what set the compiler and allocators.
RECORDED_ENV = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_ALLOCATOR",
                "XLA_FLAGS", "KERAS_BACKEND", "TF_CPU_ALLOCATOR_USE_BFC", "PYTORCH_CUDA_ALLOC_CONF",
                "JAX_COMPILATION_CACHE_DIR")
#: A cell starts only with this many seconds left before ``--deadline-s`` (a Keras/XLA cell's imports and
#: compilation alone take about that; one cut short by the deadline is an error and stops the search).
DEADLINE_MARGIN_S = 60.0
#: The search's predicted start puts the peak at this fraction of the memory limit (below it: it should fit).
PREDICTED_FILL = 0.9
#: Messages are cut to this many characters.
MESSAGE_CHARS = 300
VERSIONED = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "keras", "torch", "torchvision",
             "tensorflow", "tensorflow-cpu", "numpy")


# --- the pure parts: median, search --------------------------------------------------------------------------------

def median_ms(seconds: list[float]) -> float:
    """The median of step times in seconds, in milliseconds."""
    if not seconds:
        raise ValueError("median_ms: no step times")
    return statistics.median(seconds) * 1e3


def round_batch(batch: float, step: int) -> int:
    """``batch`` down to a multiple of ``step``, at least ``step``."""
    return max(step, int(batch) // step * step)


@dataclasses.dataclass
class SearchResult:
    """The largest batch that fitted (0: none), the smallest that did not (``None``: none failed up to the cap),
    and every try in order as ``(batch, fitted)``."""

    largest: int
    smallest_failure: int | None
    tries: list[tuple[int, bool]]


def bisect_batches(fits: Callable[[int], bool], lo: int, hi: int, *, step: int = 1, tolerance: float = 0.0,
                   tries: list[tuple[int, bool]] | None = None) -> tuple[int, int]:
    """Narrow ``lo`` (fits) < ``hi`` (does not) until ``hi - lo <= max(step, tolerance * lo)`` or no multiple of
    ``step`` lies strictly between them. Returns the final ``(lo, hi)``; each try is appended to ``tries``."""
    while hi - lo > max(step, tolerance * lo):
        mid = round_batch((lo + hi) // 2, step)
        if not lo < mid < hi:
            break
        ok = fits(mid)
        if tries is not None:
            tries.append((mid, ok))
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo, hi


def search_largest(fits: Callable[[int], bool], start: int, *, factor: float = 2.0, step: int = 1,
                   tolerance: float = 0.0, max_batch: int = 1 << 20) -> SearchResult:
    """The largest batch for which ``fits`` holds, assuming it holds up to a point and fails beyond.

    From ``start`` (rounded to ``step``): while it fits, multiply by ``factor`` (capped at ``max_batch``); if the
    start fails, divide by ``factor`` until one fits. Then :func:`bisect_batches` between the last fit and the first
    failure. ``fits`` is called once per batch tried.
    """
    if factor <= 1 or step < 1 or start < 1:
        raise ValueError("search_largest: factor must exceed 1, step and start be at least 1")
    tries: list[tuple[int, bool]] = []

    def probe(batch: int) -> bool:
        ok = fits(batch)
        tries.append((batch, ok))
        return ok

    batch = round_batch(start, step)
    lo: int | None = None
    hi: int | None = None
    if probe(batch):
        lo = batch
        while lo < max_batch:
            batch = min(max_batch, max(lo + step, round_batch(lo * factor, step)))
            if not probe(batch):
                hi = batch
                break
            lo = batch
    else:
        hi = batch
        while hi > step:
            batch = min(hi - step, round_batch(hi / factor, step))
            if probe(batch):
                lo = batch
                break
            hi = batch
    if lo is None:
        return SearchResult(0, hi, tries)
    if hi is not None:
        lo, hi = bisect_batches(fits, lo, hi, step=step, tolerance=tolerance, tries=tries)
    return SearchResult(lo, hi, tries)


def predicted_start(rows: list[dict[str, Any]], limit: int | None, step: int) -> int | None:
    """The batch whose peak a line through the two largest fitting rows' peaks puts at :data:`PREDICTED_FILL` x
    ``limit``, or
    ``None`` (fewer than two such rows, no limit, or peaks that do not grow)."""
    ok = sorted((r for r in rows if r["status"] == "ok" and r.get("peak_bytes")), key=lambda r: r["batch"])
    if limit is None or len(ok) < 2 or ok[-1]["batch"] == ok[-2]["batch"]:
        return None
    (b1, p1), (b2, p2) = ((r["batch"], r["peak_bytes"]) for r in ok[-2:])
    if p2 <= p1:
        return None
    return round_batch(b2 + (PREDICTED_FILL * limit - p2) * (b2 - b1) / (p2 - p1), step)


# --- the parent: planning, one process per cell, the JSON --------------------------------------------------------

@dataclasses.dataclass
class Settings:
    """What ``gpu_step.py --whole-step`` was asked for (see its options)."""

    models: tuple[str, ...] = MODELS
    frameworks: tuple[str, ...] = FRAMEWORKS
    dtypes: tuple[str, ...] = DTYPES
    batches: dict[tuple[str, str], tuple[int, ...]] = dataclasses.field(default_factory=dict)
    parts: tuple[str, ...] = ("keras", "torch", "search")
    warmup: int = 2
    steps: int = 10
    #: The search's tries answer "does it fit?" and give a peak: one step compiles, three are timed.
    search_warmup: int = 1
    search_steps: int = 3
    dry_run: bool = False
    keras_backend: str = "auto"
    memory_limit_bytes: int | None = None
    search_model: str = "resnet50"
    search_dtype: str = "float32"
    search_start: int | None = None  # None: predicted from the matrix's rows, else the matrix's largest batch
    search_factor: float = 2.0
    search_step: int = 32
    search_tolerance: float = 0.125
    search_max_batch: int = 16384
    search_xla_flags: str = NO_REMAT_FLAGS  # added to XLA_FLAGS for the search's tries, not for ``beyond``
    beyond: tuple[float, ...] = (1.5, 2.0)
    cell_timeout_s: float = 420.0
    deadline_s: float | None = None
    output: str | None = None
    resume: str | None = None  # a JSON of an earlier run whose ok and oom cells are taken, not measured again

    @property
    def sizes(self) -> dict[str, dict[str, Any]]:
        return DRY_SIZES if self.dry_run else SIZES

    def batches_of(self, model: str, dtype: str) -> tuple[int, ...]:
        default = (DRY_BATCHES if self.dry_run else BATCHES)[model]
        return self.batches.get((model, dtype), self.batches.get((model, ""), default))


def parse_batches(items: list[str]) -> dict[tuple[str, str], tuple[int, ...]]:
    """``["resnet50=128,256", "bert-base:bfloat16=", ...]`` -> ``{("resnet50", ""): (128, 256), ("bert-base",
    "bfloat16"): ()}``: a model's batches, or one dtype's (empty: no cells)."""
    out: dict[tuple[str, str], tuple[int, ...]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        model, _, dtype = key.strip().partition(":")
        if not sep or model not in MODELS or dtype not in ("", *DTYPES):
            raise ValueError(f"--batch {item!r}: MODEL[:DTYPE]=B1,B2 with MODEL in {', '.join(MODELS)} and DTYPE "
                             f"in {', '.join(DTYPES)}")
        try:
            batches = tuple(int(b) for b in value.split(",") if b.strip())
        except ValueError:
            raise ValueError(f"--batch {item!r}: batches are whole numbers separated by commas") from None
        if any(b < 1 for b in batches):
            raise ValueError(f"--batch {item!r}: batches are at least 1")
        out[(model, dtype)] = batches
    return out


def importable(framework: str, keras_backend: str) -> str | None:
    """Why cells of ``framework`` cannot run here (``None``: they can), without importing anything."""
    needs = ("torch",) if framework == "torch" else ("keras", keras_backend)
    missing = [name for name in needs if importlib.util.find_spec(name) is None]
    return f"{', '.join(missing)} not importable" if missing else None


def keras_backend_for(settings: Settings) -> str:
    """``jax`` (the GPU run's), or on a dry run without JAX, ``tensorflow``."""
    if settings.keras_backend != "auto":
        return settings.keras_backend
    if importlib.util.find_spec("jax") is None and settings.dry_run:
        return "tensorflow"
    return "jax"


def cell_key(row: dict[str, Any]) -> tuple:
    return row["model"], row["framework"], row["dtype"], row["batch"], row.get("extra_xla_flags", "")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def device_info(dry_run: bool) -> dict[str, Any]:
    """The GPU as nvidia-smi names it (the parent imports no GPU library); on a machine without one, the CPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30,
                             check=True).stdout.strip().splitlines()[0]
        name, mib, driver = (part.strip() for part in out.split(","))
        return {"name": name, "memory_bytes": int(float(mib)) * 2**20, "driver": driver,
                "source": "nvidia-smi --query-gpu=name,memory.total,driver_version"}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {"name": f"CPU ({platform.processor() or platform.machine()})" + (" dry run" if dry_run else ""),
                "memory_bytes": None, "driver": "none (no nvidia-smi)", "source": "platform"}


def default_output_name(device_name: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``h100-80gb-hbm3-whole-step.json`` (as docs/profiles names the device)."""
    slug = re.sub(r"[^a-z0-9]+", "-", device_name.lower().replace("nvidia", "")).strip("-")
    return f"{slug or 'device'}-whole-step.json"


class Runner:
    """Runs cells, each in its own process, keeps every row, and writes the JSON after each."""

    def __init__(self, settings: Settings, tool: str, say: Callable[[str], None]):
        self.settings, self.tool, self.say = settings, tool, say
        self.backend = keras_backend_for(settings)
        self.t0 = time.monotonic()
        self.result: dict[str, Any] = {
            "tool": "tools/gpu_step.py", "mode": "whole-step", "dry_run": settings.dry_run,
            "date": datetime.date.today().isoformat(), "backend": f"keras-{self.backend}, torch",
            "device": device_info(settings.dry_run), "versions": _versions(),
            "environment": {}, "settings": self._settings_record(), "cells": [], "search": None}
        self._reused: dict[tuple, dict[str, Any]] = {}
        if settings.resume:
            with open(settings.resume) as f:
                old = json.load(f)
            sizes = old.get("settings", {}).get("sizes", {})
            self._reused = {cell_key(r): r for r in old.get("cells", []) if r["status"] in ("ok", "oom")
                            and r["model"] in settings.models and sizes.get(r["model"]) == settings.sizes[r["model"]]}
        self.jax_cache = tempfile.mkdtemp(prefix="gpu_step_jax_cache_")  # removed by run()
        env = self._child_env()
        self.result["environment"] = {key: env[key] for key in RECORDED_ENV if key in env}

    def _settings_record(self) -> dict[str, Any]:
        s = self.settings
        return {"warmup": s.warmup, "steps": s.steps, "search_warmup": s.search_warmup,
                "search_steps": s.search_steps, "sizes": {m: s.sizes[m] for m in s.models},
                "jit_compile": self.backend == "jax", "keras_backend": self.backend,
                "memory_limit_bytes": s.memory_limit_bytes,
                "timing": {"keras": "wall clock around each train_on_batch (it returns the loss as numpy, so it "
                                    "waits for the step); inputs already on the device",
                           "torch": "CUDA events around each step (wall clock on a CPU)"},
                "peak": {"jax": "memory_stats()['peak_bytes_in_use'] at the end of the process (compilation "
                                "and warm-up included)",
                         "torch": "torch.cuda.max_memory_allocated() over the timed steps (reset after warm-up)",
                         "tensorflow": "tf.config.experimental.get_memory_info(device)['peak']",
                         "cpu": "the process's peak resident memory (ru_maxrss) where no allocator reports one"}}

    def _child_env(self, extra_xla_flags: str = "") -> dict[str, str]:
        env = dict(os.environ)
        for key, value in {**CHILD_ENV, "JAX_COMPILATION_CACHE_DIR": self.jax_cache}.items():
            env.setdefault(key, value)
        env["KERAS_BACKEND"] = self.backend
        if extra_xla_flags:
            env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_xla_flags}".strip()
        return env

    def remaining_s(self) -> float | None:
        deadline = self.settings.deadline_s
        return None if deadline is None else deadline - (time.monotonic() - self.t0)

    def write(self) -> None:
        self.result["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        if not self.settings.output:
            return
        tmp = f"{self.settings.output}.tmp"
        with open(tmp, "w") as f:
            f.write(json.dumps(self.result, indent=2) + "\n")
        os.replace(tmp, self.settings.output)

    def _base_row(self, model: str, framework: str, dtype: str, batch: int, part: str,
                  extra_xla_flags: str) -> dict[str, Any]:
        return {"model": model, "framework": framework,
                "backend": self.backend if framework == "keras" else "torch", "dtype": dtype, "batch": batch,
                "part": part, "extra_xla_flags": extra_xla_flags}

    def cell(self, model: str, framework: str, dtype: str, batch: int, part: str,
             extra_xla_flags: str = "") -> dict[str, Any]:
        """One figure: measured in its own process (or taken from this run or ``--resume``), recorded, written.
        ``extra_xla_flags`` are added to XLA_FLAGS for this cell."""
        key = (model, framework, dtype, batch, extra_xla_flags)
        for row in self.result["cells"]:
            if cell_key(row) == key and row["status"] in ("ok", "oom"):
                return row
        row = self._base_row(model, framework, dtype, batch, part, extra_xla_flags)
        if key in self._reused:
            row = {**self._reused[key], "part": part, "reused": True}
        else:
            why = importable(framework, self.backend)
            remaining = self.remaining_s()
            if why:
                row.update(status="unavailable", message=why)
            elif remaining is not None and remaining < DEADLINE_MARGIN_S:
                row.update(status="skipped", message=f"--deadline-s: {max(remaining, 0):.0f} s left")
            else:
                timeout = self.settings.cell_timeout_s if remaining is None else min(self.settings.cell_timeout_s,
                                                                                     remaining)
                self.say(f"[{len(self.result['cells']) + 1}] {framework} {model} {dtype} batch {batch}"
                         + (f" (XLA_FLAGS += {extra_xla_flags})" if extra_xla_flags else "") + " ...")
                row.update(self._spawn(row, timeout))
        self._apply_limit(row)
        self.result["cells"].append(row)
        self.say(f"    {describe(row)}")
        self.write()
        return row

    def _apply_limit(self, row: dict[str, Any]) -> None:
        """``--memory-limit-bytes`` on the searched model's Keras cells (matrix ones too: the search reuses them)."""
        limit, s = self.settings.memory_limit_bytes, self.settings
        searched = (row["model"], row["framework"], row["dtype"]) == (s.search_model, "keras", s.search_dtype)
        if limit is not None and searched and row["status"] == "ok" and (row.get("peak_bytes") or 0) > limit:
            row.update(status="oom", message=f"peak {row['peak_bytes']} B over --memory-limit-bytes {limit} "
                                             "(a fake limit: measured, then counted out of memory)")

    def _spawn(self, row: dict[str, Any], timeout: float) -> dict[str, Any]:
        s, search = self.settings, row["part"] == "search"
        spec = {"model": row["model"], "framework": row["framework"], "dtype": row["dtype"], "batch": row["batch"],
                "sizes": s.sizes[row["model"]], "warmup": s.search_warmup if search else s.warmup,
                "steps": s.search_steps if search else s.steps, "dry_run": s.dry_run}
        with tempfile.TemporaryDirectory(prefix="gpu_step_cell_") as tmp:
            out = os.path.join(tmp, "row.json")
            t0 = time.monotonic()
            try:
                proc = subprocess.run([sys.executable, self.tool, "--cell", json.dumps(spec), "--cell-out", out],
                                      env=self._child_env(row["extra_xla_flags"]), capture_output=True, text=True,
                                      timeout=timeout)
            except subprocess.TimeoutExpired:
                return {"status": "error", "message": f"timed out after {timeout:.0f} s",
                        "wall_s": round(time.monotonic() - t0, 1)}
            wall = round(time.monotonic() - t0, 1)
            if os.path.isfile(out):
                with open(out) as f:
                    return {**json.load(f), "wall_s": wall}
        return {**failure_from_stderr(proc.stderr, proc.returncode), "wall_s": wall}

    def matrix(self, framework: str) -> None:
        s = self.settings
        for model in s.models:
            for dtype in s.dtypes:
                for batch in s.batches_of(model, dtype):
                    self.cell(model, framework, dtype, batch, "matrix")

    def search(self) -> None:
        """The largest batch Keras/XLA trains (doubling, then bisection), then ``beyond`` times it."""
        s = self.settings
        model, dtype = s.search_model, s.search_dtype
        known = [r for r in [*self.result["cells"], *self._reused.values()]  # this run's and --resume's rows
                 if (r["model"], r["framework"], r["dtype"]) == (model, "keras", dtype)]
        record: dict[str, Any] = {"model": model, "framework": "keras", "backend": self.backend, "dtype": dtype,
                                  "factor": s.search_factor, "step": s.search_step, "tolerance": s.search_tolerance,
                                  "max_batch": s.search_max_batch, "memory_limit_bytes": s.memory_limit_bytes,
                                  "search_extra_xla_flags": s.search_xla_flags,
                                  "beyond_xla_flags": self._child_env().get("XLA_FLAGS", "")}
        self.result["search"] = record
        why = importable("keras", self.backend)
        if why:
            record.update(status="unavailable", message=why)
            self.write()
            return
        limit = s.memory_limit_bytes or next((r["bytes_limit"] for r in known if r.get("bytes_limit")), None)
        start, reason = s.search_start, "--search-start"
        if start is None:
            predicted = predicted_start(known, limit, s.search_step)
            largest = max((r["batch"] for r in known if r["status"] == "ok"), default=s.search_step)
            start, reason = (max(predicted, largest), "a line through the two largest measured peaks, at "
                             f"{PREDICTED_FILL} of the limit {limit} B") if predicted else (largest,
                                                                                       "the largest batch measured")
        record.update(start=start, start_reason=reason)
        self.say(f"search: Keras/{self.backend} {model} {dtype}, from batch {start} ({reason})")

        def fits(batch: int) -> bool:
            row = self.cell(model, "keras", dtype, batch, "search", s.search_xla_flags)
            if row["status"] in ("error", "skipped", "unavailable"):
                raise _SearchStopped(row)
            return row["status"] == "ok"

        try:
            found = search_largest(fits, start, factor=s.search_factor, step=s.search_step,
                                   tolerance=s.search_tolerance, max_batch=s.search_max_batch)
        except _SearchStopped as stop:
            record.update(status="stopped", message=f"batch {stop.row['batch']}: {stop.row['status']}: "
                                                    f"{stop.row.get('message', '')}")
            self.write()
            return
        record.update(status="done", largest_fit=found.largest, smallest_failure=found.smallest_failure,
                      tries=[{"batch": b, "fits": ok} for b, ok in found.tries], beyond=[])
        if found.smallest_failure is None:  # the cap, not memory, ended the search: nothing is past memory
            record["beyond_skipped"] = f"every batch up to --search-max-batch {s.search_max_batch} fitted"
        elif not found.largest:
            record["beyond_skipped"] = "no batch fitted"
        for factor in () if "beyond_skipped" in record else s.beyond:
            batch = max(found.largest + 1, round(found.largest * factor))
            row = self.cell(model, "keras", dtype, batch, "beyond")
            record["beyond"].append({"factor": factor, "batch": batch, "status": row["status"],
                                     "step_ms": row.get("step_ms"), "peak_bytes": row.get("peak_bytes")})
        self.write()


class _SearchStopped(Exception):
    def __init__(self, row: dict[str, Any]):
        super().__init__(row.get("message", ""))
        self.row = row


def failure_from_stderr(stderr: str, returncode: int) -> dict[str, Any]:
    """A row's status and message from a cell process that wrote no row (it died): ``oom`` when its output says
    so, else ``error`` with its last telling line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    oom = [ln for ln in lines if OOM_PATTERN.search(ln)]
    if oom:
        return {"status": "oom", "message": oom[0][:MESSAGE_CHARS]}
    last = lines[-1] if lines else f"exit status {returncode}, no output"
    return {"status": "error", "message": f"exit status {returncode}: {last[:MESSAGE_CHARS]}"}


def gib(peak: int | None) -> str:
    return "no peak" if peak is None else f"{peak / 2**30:.3g} GiB"


def describe(row: dict[str, Any]) -> str:
    if row["status"] != "ok":
        return f"{row['status']}: {row.get('message', '')}"
    return (f"ok: {row['step_ms']:.1f} ms (median of {row['steps_timed']}), peak {gib(row.get('peak_bytes'))}"
            + (f", {row['wall_s']:.0f} s" if "wall_s" in row else ""))


def run(settings: Settings, tool: str, say: Callable[[str], None]) -> dict[str, Any]:
    """Every part asked for, in the order asked; the JSON is written after each cell (``settings.output``)."""
    runner = Runner(settings, tool, say)
    try:
        for part in settings.parts:
            if part == "search":
                runner.search()
            else:
                runner.matrix(part)
        runner.write()
    finally:
        shutil.rmtree(runner.jax_cache, ignore_errors=True)
    return runner.result


def table(result: dict[str, Any]) -> str:
    lines = [f"{result['device']['name']}, driver {result['device']['driver']}, {result['date']}"
             + (" (dry run: tiny sizes on the CPU)" if result.get("dry_run") else ""),
             "| model | framework | dtype | batch | part | status | step ms (median) | chained ms | peak GiB | "
             "first step s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["cells"]:
        head = f"| {r['model']} | {r['framework']} ({r['backend']}) | {r['dtype']} | {r['batch']} | {r['part']} |"
        peak = f"{r['peak_bytes'] / 2**30:.3g}" if r.get("peak_bytes") else ""
        if r["status"] != "ok":  # a fake limit's oom keeps its measured peak
            lines.append(f"{head} {r['status']} | {r.get('message', '')[:80]} | | {peak} | |")
            continue
        chained = f"{r['chained_step_ms']:.1f}" if r.get("chained_step_ms") else ""
        lines.append(f"{head} ok | {r['step_ms']:.1f} | {chained} | {peak} | {r.get('first_step_s', 0):.1f} |")
    search = result.get("search")
    if search:
        lines.append("")
        if search.get("status") == "done":
            beyond = "; ".join(f"{b['factor']}x = {b['batch']}: {b['status']}"
                               + (f" {b['step_ms']:.1f} ms, {gib(b['peak_bytes'])}" if b["status"] == "ok"
                                  else "") for b in search["beyond"])
            flags = search.get("search_extra_xla_flags")
            lines.append(f"Largest {search['model']} {search['dtype']} batch that fits, Keras/{search['backend']}"
                         + (f" with XLA_FLAGS += {flags}" if flags else "") + f": {search['largest_fit']} (smallest "
                         f"that did not: {search['smallest_failure']}; tried "
                         f"{', '.join(str(t['batch']) + ('' if t['fits'] else ' x') for t in search['tries'])}). "
                         f"Beyond it, XLA_FLAGS as given ({search.get('beyond_xla_flags') or 'none'}): "
                         f"{beyond or search.get('beyond_skipped', 'nothing run')}")
        else:
            lines.append(f"Search {search.get('status')}: {search.get('message', '')}")
    return "\n".join(lines)


# --- one cell, in its own process ----------------------------------------------------------------------------------

class Unavailable(RuntimeError):
    """The cell cannot run here (no GPU outside a dry run)."""


def _peak_rss_bytes() -> int:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _timed(fn: Callable[[], Any], warmup: int, steps: int, clock) -> tuple[float, list[float]]:
    """The first call's seconds (compilation included), then ``steps`` timed calls after ``warmup`` in all."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        fn()
    return first, [clock(fn) for _ in range(steps)]


def _wall(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_spec(model: str, dtype: str):
    """The bench's :class:`benchlib.models.ModelSpec` of ``model`` in ``dtype`` (bfloat16: its ``-amp-bf16`` row,
    or the float32 model under ``mixed_bfloat16`` as :func:`benchlib.models.mixed_precision_spec` builds one)."""
    from benchlib.models import MODELS as BENCH, mixed_precision_spec
    if dtype == "float32":
        return BENCH[model]
    name = f"{model}-amp-bf16"
    return BENCH.get(name) or mixed_precision_spec(BENCH[model], name, "mixed_bfloat16")


def _inputs(model: str, sizes: dict[str, Any], batch: int):
    import numpy as np
    rng = np.random.default_rng(0)
    if model == "resnet50":
        side = sizes["side"]
        return (rng.standard_normal((batch, side, side, 3), dtype=np.float32),
                rng.integers(0, 1000, batch).astype(np.int32))
    return (rng.integers(0, sizes["vocab"], (batch, sizes["seq_len"])).astype(np.int32),
            rng.integers(0, sizes["classes"], batch).astype(np.int32))


def keras_cell(spec: dict[str, Any]) -> dict[str, Any]:
    backend = os.environ.get("KERAS_BACKEND", "jax")
    import keras

    from benchlib.models import dtype_policy_scope
    row: dict[str, Any] = {"jit_compile": backend == "jax"}
    if backend == "jax":
        import jax
        device = jax.devices()[0]
        row["runtime"] = {"device_kind": device.device_kind, "platform": device.platform,
                          "platform_version": getattr(device.client, "platform_version", None)}
        if device.platform != "gpu" and not spec["dry_run"]:
            raise Unavailable(f"JAX sees no GPU (its device is {device.platform})")
        if spec["dtype"] == "float32":  # TF32 products, as TensorFlow runs float32 on Ampere and later
            jax.config.update("jax_default_matmul_precision", "tensorfloat32")
            row["matmul_precision"] = "tensorfloat32"
    elif not spec["dry_run"]:
        raise Unavailable(f"the GPU run compiles with XLA through JAX, not KERAS_BACKEND={backend}")
    bench = bench_spec(spec["model"], spec["dtype"])
    keras.utils.set_random_seed(0)
    with dtype_policy_scope(bench.dtype_policy):
        model, optimizer, loss = bench.sized(**spec["sizes"])()
        model.compile(optimizer=optimizer, loss=loss, jit_compile=row["jit_compile"])
        x, y = (keras.ops.convert_to_tensor(a) for a in _inputs(spec["model"], spec["sizes"], spec["batch"]))
        row["resident_bytes"] = _allocator_stats(backend).get("bytes_in_use")
        first, times = _timed(lambda: model.train_on_batch(x, y), spec["warmup"], spec["steps"], _wall)
        row.update(first_step_s=round(first, 3), step_ms=median_ms(times), step_ms_spread=[min(times) * 1e3,
                   max(times) * 1e3], steps_timed=len(times))
        if backend == "jax":
            row["chained_step_ms"] = _chained_jax_steps_ms(model, x, y, spec["steps"])
    stats = _allocator_stats(backend)
    row.update(peak_bytes=stats.get("peak_bytes"), peak_source=stats["source"], bytes_limit=stats.get("bytes_limit"))
    return row


def _allocator_stats(backend: str) -> dict[str, Any]:
    """The allocator's bytes in use, peak and limit where it reports them; on a CPU without them, the process's
    peak resident memory; on a GPU without them, no peak (``None``) rather than the host's."""
    if backend == "jax":
        import jax
        device = jax.devices()[0]
        stats = device.memory_stats()
        if stats and stats.get("peak_bytes_in_use"):
            return {"bytes_in_use": stats.get("bytes_in_use"), "peak_bytes": stats["peak_bytes_in_use"],
                    "bytes_limit": stats.get("bytes_limit"), "source": "jax memory_stats peak_bytes_in_use"}
        if device.platform != "cpu":
            return {"peak_bytes": None, "source": f"none: memory_stats() gave {sorted(stats or {})}"}
    elif backend == "tensorflow":
        import tensorflow as tf
        device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
        try:
            info = tf.config.experimental.get_memory_info(device)
        except (ValueError, RuntimeError):
            info = {}
        if info.get("peak"):
            return {"bytes_in_use": info["current"], "peak_bytes": info["peak"],
                    "source": f"tensorflow get_memory_info({device!r}) peak"}
    return {"peak_bytes": _peak_rss_bytes(), "source": "ru_maxrss (peak resident memory of the process)"}


def _chained_jax_steps_ms(model, x, y, steps: int) -> float | None:
    """Keras's compiled train function called ``steps`` times back to back, waited for once at the end: the step
    without train_on_batch's per-step wait and Python (Keras internals: ``None`` where they differ)."""
    try:
        import jax
        state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                     optimizer_variables=True, metrics_variables=True, purge_model_variables=False)

        def data():
            yield (x, y, None)
        logs, state = model.train_function(state, data())  # once more, untimed: the same compiled function
        jax.block_until_ready((logs, state))
        t0 = time.perf_counter()
        for _ in range(steps):
            logs, state = model.train_function(state, data())
        jax.block_until_ready((logs, state))
        return (time.perf_counter() - t0) / steps * 1e3
    except Exception as err:  # noqa: BLE001 - an extra figure; Keras's internals may move
        print(f"gpu_step: chained steps not timed: {type(err).__name__}: {err}", file=sys.stderr)
        return None


def build_torch_resnet50(torch, torchvision: bool = True):
    """torchvision's ResNet-50 (v1.5: the stride in each first block's 3x3) when it imports and works, else the
    same network built here (Keras's ResNet50 is v1, its stride in the 1x1; the FLOPs differ by about 5%).
    Returns the model and where it came from."""
    why = "not tried"
    if torchvision:
        try:
            import torchvision as tv
            return tv.models.resnet50(weights=None, num_classes=1000), f"torchvision {tv.__version__}"
        except Exception as err:  # noqa: BLE001 - a torchvision built for another torch fails in its own ways
            why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    layers, cin = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                   nn.MaxPool2d(3, 2, 1)], 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers), f"built here (ResNet-50 v1.5, torchvision's layout; torchvision: {why})"


def torch_cell(spec: dict[str, Any]) -> dict[str, Any]:
    import torch
    cuda = torch.cuda.is_available()
    if not cuda and not spec["dry_run"]:
        raise Unavailable("PyTorch sees no CUDA GPU")
    dev = torch.device("cuda" if cuda else "cpu")
    torch.set_float32_matmul_precision("high")  # TF32 products, as TensorFlow's float32 default
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    row: dict[str, Any] = {"runtime": {"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
                                       "device": torch.cuda.get_device_name(0) if cuda else "cpu"}}
    sizes, batch = spec["sizes"], spec["batch"]
    x_np, y_np = _inputs(spec["model"], sizes, batch)
    if spec["model"] == "resnet50":
        model, row["source"] = build_torch_resnet50(torch)
        model = model.to(dev, memory_format=torch.channels_last)
        x = torch.from_numpy(x_np).permute(0, 3, 1, 2).to(dev).contiguous(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        row["memory_format"] = "channels_last"
    else:
        from gpu_step import build_torch_bert
        model, row["source"] = build_torch_bert(torch, sizes).to(dev), "tools/gpu_step.py build_torch_bert"
        x = torch.from_numpy(x_np).long().to(dev)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    y = torch.from_numpy(y_np).long().to(dev)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=spec["dtype"] == "bfloat16")

    def step():
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out = model(x)
        torch.nn.functional.cross_entropy(out.float(), y).backward()
        optimizer.step()

    def events(fn) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3

    t0 = time.perf_counter()
    step()
    if cuda:
        torch.cuda.synchronize()
    first = time.perf_counter() - t0
    for _ in range(spec["warmup"] - 1):
        step()
    if cuda:
        torch.cuda.synchronize()
        row["resident_bytes"] = int(torch.cuda.memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    times = [events(step) if cuda else _wall(step) for _ in range(spec["steps"])]
    row.update(first_step_s=round(first, 3), step_ms=median_ms(times),
               step_ms_spread=[min(times) * 1e3, max(times) * 1e3], steps_timed=len(times))
    if cuda:
        row.update(peak_bytes=int(torch.cuda.max_memory_allocated()), peak_source="torch.cuda.max_memory_allocated",
                   bytes_limit=int(torch.cuda.get_device_properties(0).total_memory))
    else:
        row.update(peak_bytes=_peak_rss_bytes(), peak_source="ru_maxrss (peak resident memory of the process)")
    return row


def run_cell(spec: dict[str, Any], out: str) -> int:
    """Measure one cell (``spec`` from :meth:`Runner._spawn`) and write its row to ``out``; an out-of-memory
    failure is a row (status ``oom``), as is any other failure (``error``)."""
    measure = torch_cell if spec["framework"] == "torch" else keras_cell
    try:
        row = {"status": "ok", **measure(spec)}
    except Unavailable as err:
        row = {"status": "unavailable", "message": str(err)}
    except Exception as err:  # noqa: BLE001 - every failure is a result
        text = f"{type(err).__name__}: {err}"
        oom = OOM_PATTERN.search(text)
        first = next((ln.strip() for ln in text.splitlines() if OOM_PATTERN.search(ln)), None) if oom else None
        row = {"status": "oom" if oom else "error", "message": (first or text.splitlines()[0])[:MESSAGE_CHARS]}
    with open(out, "w") as f:
        json.dump(row, f)
    return 0
