"""Executor memory of a rewritten step that keeps XLA (issue 47, item 5): measured against its budget and its simulation.

For each model and budget fraction the training step is rewritten by the pipeline's ``xla=True`` path
(``tflms.pipeline.rewrite_step(step, LMSConfig(budget=..., profile="emulated-cpu", ...), xla=True)``: tuned, ordered
and held to the budget on the ``xla-clusters`` clock, its compute ops marked for XLA between the copies), for
``resident + fraction x transient`` of the clustered original as the same clock simulates it. Each variant runs in
TensorFlow's executor on the emulated machine with the accelerator on logical CPU:0 (``accelerator_cpu=0``: XLA
clusters fail on CPU:1, tflms/measure/emulation.py) and the host on CPU:1, ``DeepCopy`` swaps; its peak is read from
the allocator's own events (``allocator_trace``: XLA's buffers included; the allocation records see none).

Planned and measured for the emulated machine (``tflms.measure.planning_for_emulation``): the gradients XLA:CPU
lowers into buffers XLA:GPU does not have (max-pool gradients, filter gradients:
``tflms.measure.emulation.EMULATION_XLA_LEFT_OUT``; forward convolutions whose kernel's window exceeds their input,
whose kernels XLA:CPU reverses: ``EMULATION_XLA_LEFT_OUT_RULES``) run outside the clusters, in the pass and the
simulation alike, so that what is measured is the step the simulator prices. ``--all-in-xla`` clusters them too:
what XLA:CPU itself compiles, and how far that is from the simulation. The copy XLA:CPU makes of a backward-input
convolution's kernel, which XLA:GPU does not, stays in the clusters and is priced on the emulated profile
(``HardwareProfile.xla_kernel_copies``).

Isolation: each variant is measured in an executor subprocess of its own. Measured together in one process (original,
pinned and unpinned rewrites in turn, as this tool did until e9397ac), the CNN's unpinned rewrite at 0.65 peaked at
15.0 MiB in every run; alone, at about 10.3 (docs/design.md, "Measuring a clustered step").

Variants: ``original`` (the step clustered as the pass clusters it, nothing swapped); with ``--update-parts N``,
``original, N parts`` (the same, its variables' updates in up to N parts: ``cluster_for_xla(update_parts=N)``, priced
with ``SimOptions.xla_update_parts``); ``rewritten`` (what the
pipeline returns; guarantee ``xla-alone`` where it leaves the step to XLA, compiled whole, which the ``xla`` clock
prices: XLA:CPU then compiles the gradients the emulation leaves out of clusters too); ``unpinned`` (the same plan before the budget guarantee, when the guarantee pinned level order
with control edges: those edges change the clusters).

Columns (MiB): ``sim``: the xla-clusters clock's transient peak of the graph as run (its clusters and other ops in
the executor's order, first ready first: ``tflms.sim.clusters.contracted_order``; the tuner's margin convention: a
budget given is kept as given); ``measured``: the allocator-event transient peak, median of
``--repeat`` runs (``max``: the largest); ``records``: the allocation records' peak of the same runs (XLA's buffers
missing); ``total``: resident + the largest run; ``within``: total <= budget; ``sim/meas``. With ``--dump DIR``,
XLA writes each cluster's buffer assignment there (``XLA_FLAGS=--xla_dump_to``) and the table adds the largest
``preallocated-temp`` (XLA:CPU's one temporary allocation) of each variant's modules. With ``--at-peak``, each
variant's largest run is broken down at its peak: the allocator's live allocations by node (``cluster_N_1/xla_run``:
an XLA cluster's result buffers and temporary; any other name, a TensorFlow kernel's;
``DeviceMemory.live_at_peak``), beside the simulation's live tensors at its own peak.

    python tools/validate_xla_memory.py --models cnn
    python tools/validate_xla_memory.py --models resnet50 --size 64 --batch 16 --fractions 0.8,0.9 --json
    python tools/validate_xla_memory.py --models bert --fractions 0.65,0.8 --repeat 2     # the zoo's 2-layer BERT
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import validate_memory as vm

#: ``--at-peak``: how many of the largest measured and simulated buffers each variant lists.
AT_PEAK_ROWS = 12
#: Issue 47's target: the simulation within this relative error of the executor.
TARGET_RELATIVE_ERROR = 0.10
DEFAULT_FRACTIONS = (0.65, 0.8)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclasses.dataclass
class Record:
    model: str
    variant: str
    batch: int
    budget_bytes: int | None
    resident_bytes: int
    sim_transient_bytes: int
    measured_runs: list[int]
    records_runs: list[int]
    host_runs: list[int]
    xla_runs: int
    guarantee: str = ""
    predicted_peak_bytes: int | None = None  # the tuner's own prediction (with its margin)
    temp_bytes: int | None = None  # the largest preallocated-temp of the variant's XLA modules (--dump)
    variables_digest: str = ""  # SHA-256 of the variables after the first measured run's steps (names and bytes)
    #: ``--at-peak``: what was live at the largest run's peak, ``{"run", "micros", "measured": [[node, bytes], ...],
    #: "simulated": [[tensor, bytes], ...]}`` (:data:`AT_PEAK_ROWS` largest of each; module doc)
    at_peak: dict[str, Any] | None = None

    @property
    def measured_bytes(self) -> int:
        return sorted(self.measured_runs)[(len(self.measured_runs) - 1) // 2]

    @property
    def total_worst_bytes(self) -> int:
        return self.resident_bytes + max(self.measured_runs)

    @property
    def within_budget(self) -> bool | None:
        return None if self.budget_bytes is None else self.total_worst_bytes <= self.budget_bytes

    @property
    def sim_ratio(self) -> float:
        return self.sim_transient_bytes / self.measured_bytes if self.measured_bytes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "measured_bytes": self.measured_bytes,
                "total_worst_bytes": self.total_worst_bytes, "within_budget": self.within_budget,
                "sim_ratio": self.sim_ratio}


def _builders(size: int | None) -> None:
    """ResNet-50 and the U-Net at ``size`` (a small input) instead of validate_memory's 224 / 64."""
    def resnet50(keras: Any, batch: int):
        s = size or 64
        model = keras.applications.ResNet50(weights=None, input_shape=(s, s, 3), classes=10,
                                            classifier_activation=None)
        return model, keras.optimizers.SGD(0.05, momentum=0.9), (batch, s, s, 3), (batch,), 10

    def unet3d(keras: Any, batch: int):
        from tflms.models import build_unet3d
        s = size or 32
        return (build_unet3d(channels=4, classes=4, base_filters=8, depth=3), keras.optimizers.Adam(1e-3),
                (batch, s, s, s, 4), (batch, s, s, s), 4)

    vm._BUILDERS["resnet50"] = (resnet50, vm._BUILDERS["resnet50"][1])
    vm._BUILDERS["unet3d"] = (unet3d, vm._BUILDERS["unet3d"][1])


def run_model(model: str, *, fractions=DEFAULT_FRACTIONS, repeat: int = 3, batch: int | None = None,
              size: int | None = None, dump: str | None = None, all_in_xla: bool = False,
              update_parts: int = 1, at_peak: bool = False) -> list[Record]:
    """Rewrite, simulate and measure ``model`` (module doc); one executor subprocess per variant.
    ``all_in_xla``: cluster every op XLA:CPU compiles, those the emulation leaves out too (module doc);
    ``update_parts``: above 1, add the original with its variables' updates in up to that many parts; ``at_peak``:
    break each variant's largest run down at its peak (module doc)."""
    from tflms.measure import planning_for_emulation
    from tflms.passes.xla_clusters import leave_out

    with contextlib.ExitStack() as planning:
        planning.enter_context(planning_for_emulation())
        if all_in_xla:
            planning.enter_context(leave_out({}))
        return _run_model(model, fractions=fractions, repeat=repeat, batch=batch, size=size, dump=dump,
                          update_parts=update_parts, at_peak=at_peak)


def config(budget: int | None) -> Any:
    """The ``LMSConfig`` every rewrite here is planned with: the emulated machine, ``budget`` bytes."""
    from tflms.config import LMSConfig
    from tflms.measure import EMULATION_PROFILE
    from tflms.measure.emulation import XLA_ACCELERATOR_DEVICE as ACC
    from tflms.measure.emulation import XLA_HOST_DEVICE as HOST
    return LMSConfig(budget=budget, profile=EMULATION_PROFILE.name, accelerator_device=ACC, host_device=HOST,
                     plan_cache=False)


@dataclasses.dataclass
class Setup:
    """A model's step as every variant starts from: ``case`` (``validate_memory.Case``), ``plain`` (its graph, traced
    without grappler as the ``xla=True`` path traces it), ``options`` (the ``xla-clusters`` clock's), ``original``
    (``plain`` clustered, nothing swapped) and ``base`` (its simulation)."""

    case: Any
    plain: Any
    options: Any
    original: Any
    base: Any

    def budget(self, fraction: float) -> int:
        """``resident + fraction x transient`` of the clustered original, as simulated."""
        return int(self.base.resident_bytes + fraction * self.base.transient_peak_bytes)


def setup(model: str, *, batch: int | None = None, size: int | None = None) -> Setup:
    """``model``'s :class:`Setup`; call inside ``tflms.measure.planning_for_emulation()``."""
    from tflms.budget import budget_sim_options
    from tflms.ir import tf_io
    from tflms.measure import EMULATION_PROFILE
    from tflms.measure.emulation import XLA_ACCELERATOR_DEVICE as ACC
    from tflms.measure.emulation import XLA_HOST_DEVICE as HOST
    from tflms.passes.xla_clusters import cluster_for_xla
    from tflms.pipeline import xla_sim_options
    from tflms.pipeline.load_build import _traced_and_preoptimized
    from tflms.profiles import register_profile
    from tflms.sim.simulator import simulate

    _builders(size)
    register_profile(EMULATION_PROFILE)
    case = vm.build_case(model, batch=batch)
    _, traced = _traced_and_preoptimized(case.concrete_function, (), example_inputs=None, grappler=False)
    plain = tf_io.load_graph(traced)
    options = xla_sim_options(budget_sim_options(config(None)), plain, ACC)
    original = cluster_for_xla(plain, accelerator_device=ACC, host_device=HOST).graph
    return Setup(case, plain, options, original, simulate(original, EMULATION_PROFILE, options=options))


def _run_model(model: str, *, fractions, repeat: int, batch: int | None, size: int | None,
               dump: str | None, update_parts: int = 1, at_peak: bool = False) -> list[Record]:
    import tflms.passes.order as order_pass
    from tflms.budget import budget_sim_options
    from tflms.errors import BudgetError
    from tflms.ir import tf_io
    from tflms.ir.xla_segments import UPDATE_PARTS
    from tflms.measure import EMULATION_PROFILE, measure_executor_peaks, step_request
    from tflms.measure.emulation import XLA_ACCELERATOR_DEVICE as ACC
    from tflms.measure.emulation import XLA_HOST_DEVICE as HOST
    from tflms.passes.xla_clusters import cluster_for_xla
    from tflms.pipeline import rewrite_step, xla_sim_options
    from tflms.sim.simulator import simulate

    start = setup(model, batch=batch, size=size)
    case, plain, options, original = start.case, start.plain, start.options, start.original
    variants: list[tuple[str, int | None, Any, Any, str, int | None]] = [
        ("original", None, original, options, "", None)]
    if update_parts > 1:
        parted = cluster_for_xla(plain, accelerator_device=ACC, host_device=HOST, update_parts=update_parts).graph
        variants.append((f"original, {update_parts} parts", None, parted,
                         dataclasses.replace(options, xla_update_parts=update_parts), "", None))
    before_guarantee: dict[str, Any] = {}
    hold = order_pass.hold_to_budget

    def held(graph: Any, order: Any, **kwargs: Any):
        before_guarantee["graph"] = graph
        return hold(graph, order, **kwargs)

    order_pass.hold_to_budget = held
    try:
        for fraction in fractions:
            budget = start.budget(fraction)
            progress(f"{model}: rewriting for {fraction} of the transient ({budget / 2**20:.1f} MiB) ...")
            try:
                result = rewrite_step(case.concrete_function, config(budget), copy_op="DeepCopy", xla=True,
                                      build=False)
            except BudgetError as exc:
                progress(f"  nothing fits: {exc}")
                continue
            opts = xla_sim_options(budget_sim_options(config(budget)), result.graph, ACC)
            order = result.report.order or {}
            predicted = result.report.tuning.get("predicted_peak_bytes")
            guarantee = order.get("guarantee", "")
            if result.report.tuning.get("strategy") == "xla-alone":  # compiled whole: priced on the xla clock
                opts, guarantee = dataclasses.replace(opts, clock="xla"), "xla-alone"
            variants.append((f"rewritten {fraction}", budget, result.graph, opts, guarantee, predicted))
            if order.get("guarantee") == "pinned" and order.get("edges"):
                parts = UPDATE_PARTS if (result.report.xla_clusters or {}).get("update_parts") else 1
                tuning = result.report.tuning  # clustered as the pipeline clustered the pinned step
                unpinned = cluster_for_xla(before_guarantee["graph"], accelerator_device=ACC, host_device=HOST,
                                           update_parts=parts, land_cuts=bool(tuning.get("xla_land_cuts")),
                                           clones_last=bool(tuning.get("xla_clones_last"))).graph
                variants.append((f"unpinned {fraction}", budget, unpinned, opts, "none", predicted))
    finally:
        order_pass.hold_to_budget = hold

    sims = [simulate(graph, EMULATION_PROFILE, options=opts) for _, _, graph, opts, _, _ in variants]
    requests = [step_request(case.concrete_function, case.args, graph_def=tf_io.to_graph_def(graph),
                             allocator_trace=True, accelerator_cpu=0) for _, _, graph, _, _, _ in variants]
    temps: list[int | None] = [None] * len(variants)
    progress(f"{model}: measuring {len(requests)} graphs x {repeat} runs ...")
    t0 = time.perf_counter()
    runs = []
    for k, request in enumerate(requests):  # one subprocess per variant (module doc, "Isolation")
        folder = Path(dump) / f"{model}_{k}" if dump else None
        with _xla_flags(f"--xla_dump_to={folder} --xla_dump_hlo_as_text") if folder else contextlib.nullcontext():
            runs.append(measure_executor_peaks([request] * repeat, timeout_s=600 * repeat))
        if folder:
            temps[k] = largest_temp(folder)
    progress(f"  {time.perf_counter() - t0:.0f} s")
    records = []
    for (name, budget, _, _, guarantee, predicted), sim, measured, temp in zip(variants, sims, runs, temps):
        records.append(Record(
            model=model, variant=name, batch=case.batch, budget_bytes=budget, resident_bytes=sim.resident_bytes,
            sim_transient_bytes=sim.transient_peak_bytes,
            measured_runs=[m.allocator_peak("accelerator") for m in measured],
            records_runs=[m.peak("accelerator") for m in measured],
            host_runs=[m.allocator_peak("host") for m in measured],
            xla_runs=max(sum(1 for n in m.node_times if n.endswith("xla_run")) for m in measured),
            guarantee=guarantee, predicted_peak_bytes=predicted, temp_bytes=temp,
            variables_digest=_digest(measured[0].variables_after),
            at_peak=_at_peak(measured, sim) if at_peak else None))
    return records


def _at_peak(measured: list[Any], sim: Any) -> dict[str, Any]:
    """``Record.at_peak`` of a variant: its largest run's live allocations at their peak, and the simulation's."""
    run = max(range(len(measured)), key=lambda k: measured[k].allocator_peak("accelerator"))
    micros, live = measured[run].allocator_devices["accelerator"].live_at_peak()
    return {"run": run, "micros": micros, "measured": [list(item) for item in live[:AT_PEAK_ROWS]],
            "simulated": [list(item) for item in sim.live_at_peak[:AT_PEAK_ROWS]]}


def at_peak_table(records: list[Record]) -> str:
    """``--at-peak``'s breakdown of each variant, measured beside simulated (MiB)."""
    lines = []
    for r in records:
        if r.at_peak is None:
            continue
        lines.append(f"\n{r.model} {r.variant}: run {r.at_peak['run'] + 1} at {r.at_peak['micros'] / 1000:.1f} ms "
                     f"(measured, by allocating node) | simulated (by tensor)")
        measured, simulated = r.at_peak["measured"], r.at_peak["simulated"]
        for k in range(max(len(measured), len(simulated))):
            left = f"{measured[k][1] / 2**20:8.2f}  {measured[k][0]}" if k < len(measured) else ""
            right = f"{simulated[k][1] / 2**20:8.2f}  {simulated[k][0]}" if k < len(simulated) else ""
            lines.append(f"  {left:<70.70} | {right}")
    return "\n".join(lines)


def _digest(variables: Any) -> str:
    """SHA-256 of ``{name: array}`` by name and bytes: equal digests, bitwise equal variables."""
    h = hashlib.sha256()
    for name in sorted(variables):
        h.update(name.encode())
        h.update(np.ascontiguousarray(variables[name]).tobytes())
    return h.hexdigest()


class _xla_flags:
    """``XLA_FLAGS`` for the measuring subprocesses started inside the block."""

    def __init__(self, flags: str) -> None:
        self.flags, self.saved = flags, None

    def __enter__(self) -> None:
        self.saved = os.environ.get("XLA_FLAGS")
        os.environ["XLA_FLAGS"] = self.flags

    def __exit__(self, *exc: object) -> None:
        if self.saved is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = self.saved


def largest_temp(folder: Path) -> int | None:
    """The largest ``preallocated-temp`` allocation of the buffer assignments XLA dumped in ``folder``."""
    sizes = []
    for path in folder.glob("*buffer-assignment.txt"):
        sizes += [int(m.group(1)) for m in re.finditer(r"^allocation \d+: size (\d+).*preallocated-temp",
                                                       path.read_text(), re.MULTILINE)]
    return max(sizes, default=None)


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f}"


def table(records: list[Record]) -> str:
    header = (f"{'model':<9}{'batch':>6} {'variant':<16}{'guarantee':<10}{'budget':>9}{'sim':>9}{'measured':>10}"
              f"{'max':>8}{'records':>9}{'total':>9}{'within':>8}{'sim/meas':>10}{'clusters':>10}{'XLA temp':>10}")
    lines = ["MiB; sim, measured, max, records: accelerator transient; total = resident + max", header,
             "-" * len(header)]
    for r in records:
        within = "" if r.within_budget is None else ("yes" if r.within_budget else "NO")
        lines.append(f"{r.model:<9}{r.batch:>6} {r.variant:<16}{r.guarantee:<10}{_mib(r.budget_bytes):>9}"
                     f"{_mib(r.sim_transient_bytes):>9}{_mib(r.measured_bytes):>10}{_mib(max(r.measured_runs)):>8}"
                     f"{_mib(max(r.records_runs)):>9}{_mib(r.total_worst_bytes):>9}{within:>8}{r.sim_ratio:>10.3f}"
                     f"{r.xla_runs:>10}{_mib(r.temp_bytes):>10}")
    rewritten = [r for r in records if r.variant.startswith("rewritten")]
    if rewritten:
        met = all(r.within_budget for r in rewritten) and all(
            abs(r.sim_ratio - 1) <= TARGET_RELATIVE_ERROR for r in rewritten)
        lines.append(f"\nissue 47 target (every rewrite within its budget and within "
                     f"{TARGET_RELATIVE_ERROR:.0%} of its simulation): {'met' if met else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn",
                        help="comma-separated: cnn, resnet, mlp, resnet50, unet3d, bert, bert12")
    parser.add_argument("--fractions", default=",".join(map(str, DEFAULT_FRACTIONS)),
                        help="budgets: resident + this fraction of the clustered original's simulated transient "
                             "(\"\": none)")
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--size", type=int, default=None, help="input size of resnet50 (64) and unet3d (32)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dump", default=None, help="folder for XLA's buffer assignments (--xla_dump_to)")
    parser.add_argument("--all-in-xla", action="store_true",
                        help="cluster the ops the emulation leaves out too (EMULATION_XLA_LEFT_OUT and _RULES): the "
                             "memory of XLA:CPU's own lowerings, which the simulator (XLA:GPU's) does not price")
    parser.add_argument("--update-parts", type=int, default=1,
                        help="also measure the original with its variables' updates in up to this many parts")
    parser.add_argument("--at-peak", action="store_true",
                        help="break each variant's largest run down at its peak: live allocations by node, beside "
                             "the simulation's live tensors")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    fractions = tuple(float(f) for f in args.fractions.split(",") if f.strip())
    records = []
    for model in args.models.split(","):
        records += run_model(model.strip(), fractions=fractions, repeat=args.repeat, batch=args.batch,
                             size=args.size, dump=args.dump, all_in_xla=args.all_in_xla,
                             update_parts=args.update_parts, at_peak=args.at_peak)
    print(json.dumps([r.to_dict() for r in records], indent=1) if args.json
          else table(records) + at_peak_table(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
