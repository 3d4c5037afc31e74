"""Time whole BERT-base training steps on a GPU, plain and checkpointed, and compare them with tflms's simulation.

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

``--compare`` traces the bench's BERT-base at each measured batch (``tools/benchlib``, TensorFlow on the CPU) and
simulates it on the profile the device is matched to: the plain step, and graph-level checkpointing of the same
number of segments as encoder layers (``tflms.policies.checkpoints.segment_ops``). It prints measured against
simulated step times and the recompute overhead each way. The frameworks differ (PyTorch's kernels, its autograd's
saved tensors), so memory is shown for scale, not as a check.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from typing import Any

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
            del model, opt
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", metavar="FILE", help="simulate what FILE measured, with tflms (no GPU needed)")
    parser.add_argument("--profile", help="with --compare: the profile (default: matched to the measured device)")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="float32, bfloat16 or both (default both)")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="default 8,32")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps per figure, median (default 10)")
    parser.add_argument("--json", action="store_true", help="print the JSON instead of the table")
    parser.add_argument("-o", "--output", help="also write the JSON to this file")
    args = parser.parse_args(argv)
    say = lambda what: print(f"{what} ...", file=sys.stderr, flush=True)  # noqa: E731
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
