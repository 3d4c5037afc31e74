"""Time whole training steps on a GPU: BERT-base plain and checkpointed (PyTorch), and ResNet-50 and BERT-base
compiled by XLA through Keras 3 beside PyTorch (``--whole-step``); compare the first with tflms's simulation.

Issue 27 weighs recompute against host copies by the simulator's step times. ``tools/gpu_probe.py`` checks the
cost model op by op; this tool checks it on whole steps, where the question is the tuner's: how much does
re-running the forward pass add to a training step on this GPU?

On a machine with an NVIDIA GPU and PyTorch (no TensorFlow, no tflms import), it builds the bench's BERT-base
(tools/benchlib/models.py ``build_bert``: the same layers, sizes, dropout, exact GELU, [CLS] classifier, Adam 1e-4,
sparse cross-entropy) in PyTorch and times, with CUDA events, the median of ``--repeats`` steps after warm-up:

- ``plain``: forward, backward and the optimizer update;
- ``checkpointed``: the same with each encoder layer under ``torch.utils.checkpoint`` (its input kept, its
  activations re-run in the backward pass; dropout masks replayed from the saved RNG state);
- the forward pass alone (with autograd recording), the part a recompute re-runs;

for each ``--dtypes`` (``float32`` with TF32 on, as TensorFlow runs float32 products by default; ``bfloat16``:
autocast, float32 weights, as Keras's ``mixed_bfloat16``) and ``--batches``, with the peak of PyTorch's allocator
over the step (weights, gradients and Adam's slots included).

    python tools/gpu_step.py -o docs/profiles/h100-80gb-hbm3-bert-step.json      # on the GPU machine
    python tools/gpu_step.py --compare docs/profiles/h100-80gb-hbm3-bert-step.json   # here: tflms's simulation
    python tools/gpu_step.py --predict --model resnet50 --dtype float32 --batch 128 --profile h200-141gb \
        --mode xla --json                                   # here: one step predicted, {"step_ms": ..., ...}

``--compare`` traces the bench's BERT-base at each measured batch (``tools/benchlib``, TensorFlow on the CPU) and
simulates it on the profile the device is matched to: the plain step, and graph-level checkpointing of the same
number of segments as encoder layers (``tflms.policies.checkpoints.segment_ops``). It prints measured against
simulated step times and the recompute overhead each way. The frameworks differ (PyTorch's kernels, its autograd's
saved tensors), so memory is shown for scale, not as a check.

Whole steps, XLA and PyTorch (``--whole-step``; issue 46 item 2; the machinery is tools/whole_step.py)
------------------------------------------------------------------------------------------------------
The step a Keras 3 user runs on a GPU, compiled by XLA (the compiler TensorFlow's jit uses), with the bench's own
models (tools/benchlib/models.py, built by its ``ModelSpec.sized``, under Keras's JAX backend: no TensorFlow):

- ``keras`` cells: ``model.compile(optimizer, loss, jit_compile=True)`` and ``train_on_batch`` on inputs already on
  the GPU; ResNet-50 is keras.applications ResNet50 (weights=None, 224x224x3, 1000 classes, softmax, SGD 0.01
  momentum 0.9, sparse cross-entropy on probabilities), BERT-base is ``build_bert`` (12 x 768, sequence 512, Adam
  1e-4). ``step_ms`` is the median wall time of ``--repeats`` calls after ``--warmup`` (the first compiles; each
  call waits for its step: Keras returns the loss as numpy); ``chained_step_ms`` is Keras's compiled train function
  called back to back and waited for once (the step without that wait). ``peak_bytes`` is JAX's
  ``memory_stats()['peak_bytes_in_use']`` at the end of the process (weights, optimizer slots, compilation's
  scratch and the steps), ``bytes_limit`` the allocator's limit;
- ``torch`` cells, the second reference: torchvision's ResNet-50 (v1.5; a faithful copy built here when torchvision
  does not import; channels_last, cuDNN autotuned, SGD momentum) and ``build_torch_bert`` (Adam), timed with CUDA
  events; ``peak_bytes`` is ``torch.cuda.max_memory_allocated()`` over the timed steps;
- ``float32`` runs products as TF32 (JAX ``jax_default_matmul_precision=tensorfloat32``; PyTorch
  ``set_float32_matmul_precision("high")``, cuDNN TF32), as TensorFlow does by default; ``bfloat16`` is Keras's
  ``mixed_bfloat16`` policy (as the bench's ``bert-base-amp-bf16``) and PyTorch's bf16 autocast;
- batches 128 and 256 (ResNet-50), 32 and 64 (BERT-base); each cell in its own process (a peak is a process's);
  an out-of-memory failure is a result (``status: oom``), any other failure too (``error``, with its message);
- the search: the largest ResNet-50 float32 batch that fits as written (doubling from a batch predicted from the two
  matrix peaks, then bisection to 1/8; multiples of 32; XLA_FLAGS += ``--xla_gpu_memory_limit_slop_factor=10000`` so
  that XLA never rematerializes), then 1.5x and 2x that batch with XLA as it is (``XLA:GPU`` rematerializes a
  module above (0.8 x device memory - inputs and outputs) x 0.95): whether XLA alone trains past memory.

The JSON (written after every cell, so a run cut short keeps what it measured): ``device`` (nvidia-smi's name,
memory and driver), ``versions`` (jax, jaxlib, its CUDA plugin, keras, torch, torchvision, ...), each cell's
``runtime`` (CUDA, cuDNN, JAX's platform version), ``environment`` (XLA_FLAGS, the allocator's settings),
``settings``, ``date``, ``cells`` (model, framework, backend, dtype, batch, part, status, message, step_ms,
step_ms_spread, steps_timed, chained_step_ms, peak_bytes, peak_source, bytes_limit, resident_bytes, first_step_s,
wall_s) and ``search`` (start, tries, largest_fit, smallest_failure, beyond). Progress goes to stderr, a table to
stdout at the end.

On the lent H200 (Python 3.12 with JAX 0.11 and PyTorch there, no Keras, no network): here, once,
``bash tools/fetch_gpu_wheels.sh`` (Keras 3.15.1, namex, optree into the ignored .whl/, 2.8 MB); then the device
tool's ``run`` with ``carry: [".whl"]``, ``timeout_s: 600`` and the command::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; export PYTHONUNBUFFERED=1; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 tools/gpu_step.py --whole-step --deadline-s 540 -o $OUT/h200-141gb-whole-step.json 2>&1 | tee $OUT/whole-step.log

Copy the JSON into docs/profiles/. Time (estimated, not yet measured: compilation dominates): a Keras/XLA cell
30-60 s (imports and the weights' initialisers about 10 s, XLA's compilation with autotuning 20-40 s, the steps a
few seconds), a PyTorch cell 10-20 s, a search try 40-70 s; the 8 Keras and 8 PyTorch cells 6-10 minutes, the
search 5-8 tries more. ``--deadline-s 540`` starts no cell with less than a minute to go and cuts the last at
9 minutes (those left are ``skipped``), so the command ends inside its 600 s. What did not run is measured by a
second command with the first's JSON in the working tree (copied to docs/profiles/h200-141gb-whole-step.json, say)
and ``--resume docs/profiles/h200-141gb-whole-step.json``: its ok and oom cells are taken as they are, and the
search starts from their peaks (``--frameworks keras`` leaves PyTorch out, ``--no-search`` the search).

Here, without a GPU (``--dry-run``): the same orchestration at tiny sizes (ResNet-50 at 32x32, BERT with one layer
of 64, sequence 16; batches 2 and 4) on whatever imports: Keras on JAX (XLA on the CPU) when JAX imports, else on
TensorFlow without XLA (``jit_compile=False``: the dry run checks the tool, not XLA), peaks from TensorFlow's CPU
allocator (``TF_CPU_ALLOCATOR_USE_BFC=1``) or the process's resident memory; PyTorch cells are ``unavailable``
when torch does not import. ``--memory-limit-bytes N`` counts the searched model's cells whose measured peak
exceeds N as out of memory, so the search runs its doubling and bisection on a CPU (tests/test_gpu_step_tool.py)::

    python tools/gpu_step.py --dry-run --batch bert-base=2 --search bert-base:float32 --memory-limit-bytes 2500000
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
from typing import Any

# The bench's model code (tools/benchlib) reads tflms's margin (tflms/budget.py: pure Python, numpy only): the
# repository's root on the path, for the GPU machine where tflms is not installed.
sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import whole_step  # noqa: E402 - after the path

#: tools/benchlib/models.py build_bert's defaults.
BERT = {"layers": 12, "hidden": 768, "heads": 12, "ffn": 3072, "vocab": 30522, "seq_len": 512, "dropout": 0.1,
        "classes": 2}
DTYPES = ("float32", "bfloat16")
BATCHES = (8, 32)
#: The bench's model names of each dtype (tools/benchlib/models.py).
BENCH_MODELS = {"float32": "bert-base", "bfloat16": "bert-base-amp-bf16"}


def build_torch_bert(torch, cfg: dict[str, int | float]):
    """BERT-base as tools/benchlib/models.py builds it in Keras, in PyTorch."""
    nn, F = torch.nn, torch.nn.functional
    hidden, heads = int(cfg["hidden"]), int(cfg["heads"])
    rate = float(cfg["dropout"])

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.query, self.key, self.value, self.out = (nn.Linear(hidden, hidden) for _ in range(4))
            self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
            self.ffn_in, self.ffn_out = nn.Linear(hidden, int(cfg["ffn"])), nn.Linear(int(cfg["ffn"]), hidden)
            self.ffn_norm = nn.LayerNorm(hidden, eps=1e-12)

        def forward(self, x):
            b, s, d = x.shape[0], x.shape[1], hidden // heads

            def split(t):
                return t.reshape(b, s, heads, d).transpose(1, 2)

            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            probs = torch.softmax(q @ k.transpose(2, 3) * d ** -0.5, dim=-1)
            context = F.dropout(probs, rate, self.training) @ v
            a = F.dropout(self.out(context.transpose(1, 2).reshape(b, s, hidden)), rate, self.training)
            x = self.attention_norm(x + a)
            f = F.dropout(self.ffn_out(F.gelu(self.ffn_in(x))), rate, self.training)
            return self.ffn_norm(x + f)

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(int(cfg["vocab"]), hidden)
            self.position = nn.Parameter(torch.randn(int(cfg["seq_len"]), hidden) * 0.05)
            self.embedding_norm = nn.LayerNorm(hidden, eps=1e-12)
            self.layers = nn.ModuleList(Layer() for _ in range(int(cfg["layers"])))
            self.pooler, self.classifier = nn.Linear(hidden, hidden), nn.Linear(hidden, int(cfg["classes"]))
            self.checkpointed = False

        def forward(self, ids):
            x = F.dropout(self.embedding_norm(self.embedding(ids) + self.position), rate, self.training)
            for layer in self.layers:
                if self.checkpointed:
                    x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
                else:
                    x = layer(x)
            return self.classifier(torch.tanh(self.pooler(x[:, 0])))

    return Bert()


def measure(cfg: dict, dtypes: tuple[str, ...], batches: tuple[int, ...], repeats: int,
            progress=lambda what: None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    import torch
    import torch.utils.checkpoint  # noqa: F401 (torch.utils.checkpoint.checkpoint, in the model)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_step: PyTorch sees no CUDA GPU; run it on the GPU machine (see the docstring)")
    torch.backends.cuda.matmul.allow_tf32 = True   # TensorFlow's default for float32 products on Ampere and later
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    from gpu_probe import _nvidia_smi_driver
    device = {"name": props.name, "memory_bytes": int(props.total_memory), "library": f"torch {torch.__version__}",
              "cuda_runtime": torch.version.cuda, "driver": _nvidia_smi_driver()}
    rows = []
    for dtype in dtypes:
        for batch in batches:
            torch.manual_seed(0)
            model = build_torch_bert(torch, cfg).to(dev).train()
            opt = torch.optim.Adam(model.parameters(), lr=1e-4)
            ids = torch.randint(0, int(cfg["vocab"]), (batch, int(cfg["seq_len"])), device=dev)
            labels = torch.randint(0, int(cfg["classes"]), (batch,), device=dev)
            autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bfloat16")

            def forward():
                with autocast:
                    return torch.nn.functional.cross_entropy(model(ids).float(), labels)

            def step():
                opt.zero_grad(set_to_none=True)
                forward().backward()
                opt.step()

            def forward_only():
                opt.zero_grad(set_to_none=True)
                forward()

            def time_variants(row):
                for variant, fn, ckpt in (("plain", step, False), ("checkpointed", step, True),
                                          ("forward", forward_only, False)):
                    progress(f"{dtype} batch {batch} {variant}")
                    model.checkpointed = ckpt
                    for _ in range(3):
                        fn()
                    torch.cuda.synchronize()
                    base = torch.cuda.memory_allocated()
                    torch.cuda.reset_peak_memory_stats()
                    times = []
                    for _ in range(repeats):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        fn()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end) / 1e3)
                    row[f"{variant}_s"] = statistics.median(times)
                    row[f"{variant}_spread_s"] = [min(times), max(times)]
                    if variant != "forward":  # everything allocated at the step's peak, weights and slots too
                        row[f"{variant}_peak_bytes"] = int(torch.cuda.max_memory_allocated())
                        row["resident_bytes"] = int(base)

            row = {"dtype": dtype, "batch": batch}
            try:
                time_variants(row)
            except torch.cuda.OutOfMemoryError as err:  # recorded, and the next row still runs
                row["error"] = f"out of memory: {str(err).splitlines()[0]}"
            rows.append(row)
            model = opt = None  # the next row's model builds in the memory these held
            torch.cuda.empty_cache()
    return device, rows


def simulate_rows(result: dict[str, Any], profile_name: str | None = None, progress=lambda what: None):
    """Simulated against measured, per row of ``result`` (the JSON this tool writes)."""
    import os
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    from benchlib.models import Steps

    from tflms.analysis.cto import analyze_graph
    from tflms.ir.op_types import CONTRACTION_OPS
    from tflms.passes.swaps import apply_swaps
    from tflms.policies.recompute import recompute_plan, segment_ops
    from tflms.profiles import get_profile, profile_for_device
    from tflms.sim.cost import op_time_s
    from tflms.sim.simulator import simulate
    cfg = result["model"]
    if cfg != BERT:
        raise SystemExit(f"gpu_step --compare: the file measured {cfg}, not the bench's BERT-base {BERT}")
    profile = get_profile(profile_name or profile_for_device(result["device"]["name"],
                                                            result["device"].get("memory_bytes")).name)
    steps, out = Steps(), []
    for row in result["rows"]:
        if "error" in row:
            continue
        progress(f"simulating {row['dtype']} batch {row['batch']} on {profile.name}")
        graph, _ = steps.graph(BENCH_MODELS[row["dtype"]], "plain", row["batch"])
        analysis = analyze_graph(graph)
        plain = simulate(graph, profile)
        plan = recompute_plan(analysis, segment_ops(analysis, int(cfg["layers"])))
        times = {op.name: op_time_s(graph, op, profile) for op in graph}
        ckpt = simulate(apply_swaps(graph, plan).graph, profile)
        contractions = sum(t for name, t in times.items() if graph.op(name).type in CONTRACTION_OPS)
        out.append({**row, "profile": profile.name, "sim_plain_s": plain.step_time_s,
                    "sim_contractions_s": contractions, "sim_ops": len(times),
                    "sim_checkpointed_s": ckpt.step_time_s, "sim_plain_peak_bytes": plain.peak_bytes,
                    "sim_checkpointed_peak_bytes": ckpt.peak_bytes,
                    "sim_recomputed_ops": sum(len(d.clones) for d in plan.recomputes), "segments": int(cfg["layers"])})
    return out


def compare_table(rows: list[dict[str, Any]]) -> str:
    gib = 2**30
    lines = ["| dtype | batch | plain: measured / simulated | checkpointed: measured / simulated | recompute adds: "
             "measured / simulated | forward / step, measured | peak: measured (PyTorch) / simulated (tflms), "
             "plain | simulated contractions / measured plain |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['batch']} | {r['plain_s'] * 1e3:.1f} / {r['sim_plain_s'] * 1e3:.1f} ms "
            f"({r['sim_plain_s'] / r['plain_s']:.2f}) | {r['checkpointed_s'] * 1e3:.1f} / "
            f"{r['sim_checkpointed_s'] * 1e3:.1f} ms ({r['sim_checkpointed_s'] / r['checkpointed_s']:.2f}) | "
            f"+{r['checkpointed_s'] / r['plain_s'] - 1:.1%} / +{r['sim_checkpointed_s'] / r['sim_plain_s'] - 1:.1%} "
            f"| {r['forward_s'] / r['plain_s']:.2f} | {r['plain_peak_bytes'] / gib:.2f} / "
            f"{r['sim_plain_peak_bytes'] / gib:.2f} GiB | {r['sim_contractions_s'] / r['plain_s']:.2f} |")
    return "\n".join(lines)


def measured_table(result: dict[str, Any]) -> str:
    lines = [f"{result['device']['name']} ({result['device']['library']}), {result['date']}",
             "| dtype | batch | plain ms | checkpointed ms | forward ms | recompute adds | peak plain / ckpt GiB |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['dtype']} | {r['batch']} | {r['error']} | | | | |")
            continue
        lines.append(f"| {r['dtype']} | {r['batch']} | {r['plain_s'] * 1e3:.1f} | {r['checkpointed_s'] * 1e3:.1f} | "
                     f"{r['forward_s'] * 1e3:.1f} | +{r['checkpointed_s'] / r['plain_s'] - 1:.1%} | "
                     f"{r['plain_peak_bytes'] / 2**30:.2f} / {r['checkpointed_peak_bytes'] / 2**30:.2f} |")
    return "\n".join(lines)


def _whole_step_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("whole steps (--whole-step, --dry-run; tools/whole_step.py)")
    g.add_argument("--whole-step", action="store_true", help="measure whole steps: Keras/XLA on JAX and PyTorch, "
                   "ResNet-50 and BERT-base, and the largest ResNet-50 batch XLA trains")
    g.add_argument("--dry-run", action="store_true", help="--whole-step at tiny sizes on whatever runs here (the "
                   "CPU: Keras on TensorFlow without XLA when JAX is missing; torch cells 'unavailable' without it)")
    g.add_argument("--models", default=",".join(whole_step.MODELS), help="default resnet50,bert-base")
    g.add_argument("--frameworks", default=",".join(whole_step.FRAMEWORKS),
                   help="keras, torch or both (default both): the matrix's parts")
    g.add_argument("--batch", action="append", default=[], metavar="MODEL[:DTYPE]=B1,B2",
                   help="a model's batches, or one dtype's (empty: none); default resnet50=128,256 and "
                        "bert-base=32,64 (dry run: 2,4)")
    g.add_argument("--no-search", action="store_true", help="skip the largest-batch search")
    g.add_argument("--warmup", type=int, default=2, help="steps before the timed ones, the first compiling (2)")
    g.add_argument("--search", default="resnet50:float32", metavar="MODEL:DTYPE",
                   help="what the search runs (Keras), default resnet50:float32")
    g.add_argument("--search-start", type=int, help="its first batch (default: predicted from the matrix's two "
                   "largest peaks, at 0.9 of the allocator's limit, else the matrix's largest batch)")
    g.add_argument("--search-step", type=int, help="batches are multiples of this (default 32; dry run 1)")
    g.add_argument("--search-factor", type=float, default=2.0, help="the search's growth while it fits (2)")
    g.add_argument("--search-tolerance", type=float, default=0.125,
                   help="bisection stops at a gap of this fraction of the largest fit (default 0.125)")
    g.add_argument("--search-max-batch", type=int, help="no try above this (default 16384; dry run 64)")
    g.add_argument("--search-xla-flags", default=whole_step.NO_REMAT_FLAGS, metavar="FLAGS",
                   help="added to XLA_FLAGS for the search's tries, not for the batches beyond it (default "
                        f"{whole_step.NO_REMAT_FLAGS}: XLA never rematerializes; '' searches with XLA as it is)")
    g.add_argument("--beyond", default="1.5,2", metavar="F1,F2",
                   help="after the search, the largest fit times each of these (default 1.5,2)")
    g.add_argument("--memory-limit-bytes", type=int, help="a fake memory limit: a cell of the searched model "
                   "whose measured peak is above it counts as out of memory (tests the search without a GPU)")
    g.add_argument("--cell-timeout-s", type=float, default=420.0, help="one cell's process at most (420)")
    g.add_argument("--deadline-s", type=float, help="start no cell after this many seconds (the JSON keeps what "
                   "ran; cells not run are 'skipped')")
    g.add_argument("--resume", metavar="FILE", help="take the ok and oom cells of an earlier run's JSON instead "
                   "of measuring them again (its sizes must match)")
    g.add_argument("--keras-backend", choices=("auto", "jax", "tensorflow"), default="auto")
    g.add_argument("--cell", help=argparse.SUPPRESS)
    g.add_argument("--cell-out", help=argparse.SUPPRESS)


def _whole_step_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> whole_step.Settings:
    def names(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
        chosen = tuple(n.strip() for n in text.split(",") if n.strip())
        if not chosen or not set(chosen) <= set(allowed):
            parser.error(f"{flag} takes {', '.join(allowed)}; got {text!r}")
        return chosen

    search_model, _, search_dtype = args.search.partition(":")
    if search_model not in whole_step.MODELS or search_dtype not in whole_step.DTYPES:
        parser.error(f"--search takes MODEL:DTYPE of {whole_step.MODELS} and {whole_step.DTYPES}")
    if args.repeats <= 0 or args.warmup <= 0:
        parser.error("--repeats and --warmup must be positive (the first warm-up step compiles)")
    try:
        batches = whole_step.parse_batches(args.batch)
    except ValueError as err:
        parser.error(str(err))
    frameworks = names(args.frameworks, whole_step.FRAMEWORKS, "--frameworks")
    try:
        beyond = tuple(float(f) for f in args.beyond.split(",") if f.strip())
    except ValueError:
        parser.error(f"--beyond takes factors separated by commas, got {args.beyond!r}")
    output = args.output
    if output and os.path.isdir(output):
        output = os.path.join(output, whole_step.default_output_name(whole_step.device_info(args.dry_run)["name"]))
    return whole_step.Settings(
        models=names(args.models, whole_step.MODELS, "--models"), frameworks=frameworks,
        dtypes=names(args.dtypes, whole_step.DTYPES, "--dtypes"), batches=batches,
        parts=frameworks + (() if args.no_search else ("search",)), warmup=args.warmup, steps=args.repeats,
        dry_run=args.dry_run, keras_backend=args.keras_backend, memory_limit_bytes=args.memory_limit_bytes,
        search_model=search_model, search_dtype=search_dtype, search_start=args.search_start,
        search_factor=args.search_factor,
        search_step=args.search_step or (1 if args.dry_run else 32), search_tolerance=args.search_tolerance,
        search_max_batch=args.search_max_batch or (64 if args.dry_run else 16384),
        search_xla_flags=args.search_xla_flags, beyond=beyond, cell_timeout_s=args.cell_timeout_s,
        deadline_s=args.deadline_s, output=output, resume=args.resume)


def _predict(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--predict``: one step simulated (tools/benchlib/predict.py), as one JSON object or a line."""
    missing = [flag for flag, value in (("--model", args.model), ("--dtype", args.dtype), ("--batch", args.batch),
                                        ("--profile", args.profile), ("--mode", args.mode)) if not value]
    if missing:
        parser.error(f"--predict needs {', '.join(missing)} (e.g. --model resnet50 --dtype float32 --batch 128 "
                     "--profile h200-141gb --mode xla)")
    try:
        batch = int(args.batch[-1])
    except ValueError:
        parser.error(f"--predict: --batch takes one whole number, got {args.batch[-1]!r}")
    if batch <= 0:
        parser.error(f"--predict: --batch must be positive, got {batch}")
    from benchlib.models import Steps
    from benchlib.predict import predict
    record = predict(Steps(), args.model, args.dtype, batch, args.profile, args.mode)
    print(json.dumps(record) if args.json else
          f"{record['model']} {record['dtype']} batch {batch} on {record['profile']}, {record['mode']} clock "
          f"(simulated): step {record['step_ms']:.1f} ms (contractions alone {record['contractions_ms']:.1f} ms), "
          f"peak {record['peak_bytes'] / 2**30:.2f} GiB (resident {record['resident_bytes'] / 2**30:.2f} GiB), "
          f"{record['kernels']} kernels")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", metavar="FILE", help="simulate what FILE measured, with tflms (no GPU needed)")
    parser.add_argument("--profile", help="with --compare: the profile (default: matched to the measured device)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="float32, bfloat16 or both (default both)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)),
                        help="BERT plain/checkpointed: default 8,32 (--whole-step: see --batch)")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per figure, median (default 10)")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument("-o", "--output", help="also write the JSON to this file (--whole-step: written after "
                        "each cell; a folder: named by the device, e.g. h100-80gb-hbm3-whole-step.json)")
    _whole_step_options(parser)
    g = parser.add_argument_group("prediction (--predict; tools/benchlib/predict.py): tflms's simulation of one step")
    g.add_argument("--predict", action="store_true", help="print tflms's predicted step time and peak (simulated, no "
                   "GPU) for --model, --dtype, --batch, --profile and --mode; one JSON object with --json")
    g.add_argument("--model", choices=("resnet50", "bert-base"), help="with --predict")
    g.add_argument("--dtype", choices=("float32", "bfloat16"), help="with --predict (bfloat16: Keras mixed_bfloat16)")
    g.add_argument("--mode", choices=("xla", "graph"), help="with --predict: the simulator's clock, the step XLA "
                   "compiles or TensorFlow's executor without XLA (tflms.sim.clock)")
    args = parser.parse_args(argv)
    if args.predict:
        return _predict(parser, args)
    say = lambda what: print(f"{what} ...", file=sys.stderr, flush=True)  # noqa: E731
    if args.cell:
        return whole_step.run_cell(json.loads(args.cell), args.cell_out)
    if args.whole_step or args.dry_run:
        settings = _whole_step_settings(parser, args)
        result = whole_step.run(settings, os.path.abspath(__file__),
                                lambda what: print(what, file=sys.stderr, flush=True))
        print(json.dumps(result, indent=2) if args.json else whole_step.table(result))
        return 0
    if args.compare:
        try:
            with open(args.compare) as f:
                result = json.load(f)
        except (OSError, ValueError) as err:
            raise SystemExit(f"gpu_step --compare: cannot read {args.compare}: {err}") from None
        rows = simulate_rows(result, args.profile, progress=say)
        print(json.dumps(rows, indent=2) if args.json else
              f"{result['device']['name']}, measured {result['date']}; simulated on {rows[0]['profile']}\n\n"
              + compare_table(rows))
        return 0
    dtypes = tuple(d.strip() for d in args.dtypes.split(","))
    if not set(dtypes) <= set(DTYPES) or args.repeats <= 0:
        parser.error(f"--dtypes takes {', '.join(DTYPES)}; --repeats must be positive")
    try:
        batches = tuple(int(b) for b in args.batches.split(","))
    except ValueError:
        parser.error(f"--batches takes whole numbers separated by commas, got {args.batches!r}")
    device, rows = measure(BERT, dtypes, batches, args.repeats, progress=say)
    result = {"tool": "tools/gpu_step.py", "date": datetime.date.today().isoformat(), "device": device,
              "model": BERT, "repeats": args.repeats, "rows": rows}
    from gpu_probe import emit
    return emit(result, args.output, args.json, measured_table)


if __name__ == "__main__":
    sys.exit(main())
