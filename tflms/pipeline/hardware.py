"""Which hardware a rewrite plans for, at which price, and what its report says of it.

The profile priced as TensorFlow runs float32 contractions (:func:`priced_profile`, :func:`tf32_setting`), the
default budget and where it comes from (:func:`default_budget`), the warning of a budgeted rewrite on a machine
without a GPU (:func:`no_gpu_warning`, :data:`PROFILE_DEVICE`), and the report's hardware record
(:func:`hardware_record`). Which profile is chosen is :func:`tflms.profiles.select_profile`'s decision.
"""

from __future__ import annotations

from typing import Any

from tflms.profiles import HardwareProfile, ProfileChoice

def default_budget(choice: ProfileChoice, gpu: tuple[str, int | None] | None) -> tuple[int | None, str]:
    """The budget of the default (no rule parameter, budget or profile), and one sentence saying where it is from.

    This machine's GPU memory when TensorFlow reports it; else the chosen
    profile's memory (``None``: the tuner's default), said as such.
    """
    from tflms.profiles import get_profile
    from tflms.units import format_bytes
    if gpu is not None and gpu[1]:
        return gpu[1], (f"the default: {format_bytes(gpu[1])}, the memory of this machine's GPU {gpu[0]!r} "
                        "(give budget= (--budget) or TFLMS rule parameters to choose otherwise)")
    memory = get_profile(choice.name).memory_bytes
    where = "this machine has no GPU" if gpu is None else f"the memory of this machine's GPU {gpu[0]!r} is unknown"
    return None, (f"the default: {format_bytes(memory)}, the memory of profile {choice.name} ({where}; give "
                  "budget= (--budget) or TFLMS rule parameters to choose otherwise)")


#: The device the tuner plans swap-ins for when this machine has no GPU (the profile's GPU).
PROFILE_DEVICE = "/device:GPU:0"


def no_gpu_warning(profile: str, runs_on: str) -> str:
    """The warning of a budgeted rewrite on a machine without a GPU."""
    return (f"no GPU found: planned for the GPU of profile {profile} ({PROFILE_DEVICE}), but this machine runs the "
            f"step on {runs_on}, where swapping saves no memory; the predicted peaks and overheads are that "
            "profile's, not this machine's (the rewrite still runs, which is useful for testing)")


def hardware_record(choice: ProfileChoice | None, *, planned_for: str, runs_on: str,
                    simulated: bool, profile: HardwareProfile | None = None) -> dict[str, Any]:
    """What hardware a report's plan and predictions are for (``RewriteReport.hardware``); with the priced
    ``profile``, ``math``: which math mode each dtype's contractions were priced at."""
    if choice is None:
        return {"profile": None, "source": None, "why": "TFLMS rule parameters given, no budget or profile: the "
                "swap parameters are the configuration's and nothing is simulated", "planned_for": planned_for,
                "runs_on": runs_on}
    record = {**choice.to_dict(), "profile": choice.name, "planned_for": planned_for, "runs_on": runs_on,
              "simulated": simulated}
    if profile is not None:
        record["math"] = profile.math_summary()
    return record


def tf32_setting(given: bool | None) -> bool:
    """Whether float32 contractions run as TF32: ``given`` (``LMSConfig.tf32``), else TensorFlow's setting
    (``tf.config.experimental.tensor_float_32_execution_enabled()``, on by default)."""
    if given is not None:
        return given
    import tensorflow as tf
    return bool(tf.config.experimental.tensor_float_32_execution_enabled())


def priced_profile(name: str, tf32: bool | None = None) -> HardwareProfile:
    """The registered profile ``name`` with float32 contractions priced as :func:`tf32_setting` says."""
    from tflms.profiles import get_profile
    return get_profile(name).with_tf32(tf32_setting(tf32))



def xla_sim_options(options: Any, graph: Any, accelerator: str) -> Any:
    """``options`` for a step that keeps XLA in clusters (issue 47): the ``xla-clusters`` clock
    (:mod:`tflms.sim.clusters`), which prices each candidate as :func:`tflms.passes.xla_clusters.cluster_for_xla` will
    cluster it, with the step's op types that have no XLA kernel for ``accelerator`` left out of the clusters (read
    from TensorFlow's registry, as the pass reads it), and the types and ops the machine planned for leaves out
    (:func:`tflms.passes.xla_clusters.leave_out`)."""
    import dataclasses

    from tflms.passes.xla_clusters import jit_device_for, left_out, left_out_rules, registered_xla_kernels
    from tflms.sim.clock import CLOCK_XLA_CLUSTERS
    has_kernel = registered_xla_kernels(jit_device_for(accelerator))
    declared = left_out()
    unsupported = sorted({op.type for op in graph if not has_kernel(op.type) or op.type in declared})
    return dataclasses.replace(options, clock=CLOCK_XLA_CLUSTERS, xla_unsupported=tuple(unsupported),
                               xla_left_out_rules=left_out_rules())


def update_parts_for(options: Any, graph: Any, profile: HardwareProfile, budget: int) -> Any:
    """``options`` (the ``xla-clusters`` clock's) with the variables' updates split into parts
    (:data:`tflms.ir.xla_segments.UPDATE_PARTS`) where the step as it is does not fit ``budget``.

    A cluster never updates a variable in place, and allocates each new value when it starts, so the cluster that
    updates every slot of a model holds all of them beside every gradient (:mod:`tflms.sim.clusters`, "Variable
    updates"): a floor no swap or recompute lowers, and on a small model the step's peak. In parts, each holds its own
    new values. A part costs a cluster's launches and XLA fuses nothing across parts, so a step that fits keeps one."""
    import dataclasses

    from tflms.ir.xla_segments import UPDATE_PARTS
    from tflms.sim.simulator import simulate
    if simulate(graph, profile, options=options).peak_with_margin_bytes <= budget:
        return options
    return dataclasses.replace(options, xla_update_parts=UPDATE_PARTS)


def xla_cost(graph: Any, profile: HardwareProfile, graph_step_s: float | None = None,
             xla_step_s: float | None = None) -> dict[str, Any] | None:
    """What running ``graph`` (the unchanged step) without XLA costs on ``profile``: its step on the ``graph`` clock
    (TensorFlow's executor, the step tflms's rewrites run) against the ``xla`` clock (XLA:GPU's fusions), both
    simulated (:mod:`tflms.sim.clock`); ``None`` on a CPU profile. ``graph_step_s``: the first, where the tune has it;
    ``xla_step_s``: the second, where XLA alone was priced (:mod:`tflms.tune.xla_alone`).

    Keras 3 compiles ``fit`` with XLA on a GPU by default; the callback turns XLA off for the fits it manages (XLA
    would compile the swaps away, issue 47), and says what that costs from this record (issue 46).
    """
    if profile.host_kernels:
        return None
    from tflms.sim.clock import CLOCK_GRAPH, CLOCK_XLA
    from tflms.sim.simulator import SimOptions, simulate
    if graph_step_s is None:
        graph_step_s = simulate(graph, profile, options=SimOptions(clock=CLOCK_GRAPH)).step_time_s
    if xla_step_s is None:
        xla_step_s = simulate(graph, profile, options=SimOptions(clock=CLOCK_XLA)).step_time_s
    return {"profile": profile.name, "graph_step_s": graph_step_s, "xla_step_s": xla_step_s,
            "slowdown": graph_step_s / xla_step_s if xla_step_s else None, "simulated": True}
