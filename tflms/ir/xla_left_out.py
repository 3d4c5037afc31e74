"""Ops a machine runs outside its XLA clusters by what they are, not by their type alone (issue 47).

:func:`tflms.passes.xla_clusters.leave_out` declares the op types a machine runs in TensorFlow's executor though XLA
could compile them; a *rule* here picks single ops of a type, by their attributes and input shapes. The clustering
pass and the ``xla-clusters`` clock (``SimOptions.xla_left_out_rules``) apply the same rules, by name
(:data:`RULES`), so the clock prices each candidate as the pass will cluster it.

The emulated accelerator (:mod:`tflms.measure.emulation`) declares :data:`SWAPPED_CONV`: XLA:CPU runs a forward
convolution whose kernel's window covers more points than its input as the kernel convolved with the input, and
reverses the kernel into a buffer of its own that XLA:GPU, which turns that swap off, never allocates
(:func:`swaps_conv_operands`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tflms.errors import ConfigError

#: Forward convolutions XLA's operand swap may turn around (:func:`swaps_conv_operands`).
SWAPPABLE_CONVS = ("Conv2D", "Conv3D")


def swaps_conv_operands(op: Any, inputs: Sequence[Any]) -> bool:
    """Whether XLA, where its convolution operand swap is on, runs the forward convolution ``op`` (an IR op:
    ``Conv2D`` / ``Conv3D``; ``inputs``: the ``TensorInfo`` of its input and its kernel) as a convolution of the
    kernel over the input, reversing the kernel into a buffer of its own.

    XLA does when the kernel's window covers more points than the input it slides over: the product of the kernel's
    spatial sizes against that of the input's, where a dimension whose window covers the whole unpadded input counts
    for neither (``ConvOperandSwapper``, ``xla/hlo/transforms/simplifiers/conv_operand_swapper.cc``; before it the
    algebraic simplifier's ``SwapConvOperands``). XLA:CPU runs the swap; every XLA:GPU pipeline turns it off
    (``set_enable_conv_operand_swap(false)``). ResNet-50's conv5 3x3 convolutions at a 64x64 input run on 2x2 maps:
    XLA:CPU computes their three reversed kernels (``wrapped_reverse``, 9 MiB each) at the start of the forward
    pass's cluster and keeps them to its end (docs/design.md, "Why ResNet-50's 0.8 rewrite peaks 7.6 MiB above its
    simulation"). ``False`` for any other op, where a shape is unknown, and for a grouped convolution (the swap
    handles none)."""
    if op.type not in SWAPPABLE_CONVS or len(inputs) < 2:
        return False
    shape, window = inputs[0].resolved_shape, inputs[1].shape
    if shape is None or window is None or None in shape or None in window or len(shape) != len(window):
        return False
    spatial = len(shape) - 2
    channels_first = _attr(op, "data_format", "").startswith("NC")
    sizes = shape[2:] if channels_first else shape[1:-1]
    if window[-2] != (shape[1] if channels_first else shape[-1]):
        return False  # grouped (feature_group_count > 1)

    def per_dim(name: str) -> list[int]:
        values = _attr(op, name, None) or [1] * (spatial + 2)
        return list(values[2:] if channels_first else values[1:-1])
    strides, dilations = per_dim("strides"), per_dim("dilations")
    padding = _attr(op, "padding", "VALID")
    explicit = _attr(op, "explicit_paddings", None) or []
    kernel_points = swapped_points = 1
    for d in range(spatial):
        n, k, s, r = sizes[d], window[d], strides[d], dilations[d]
        if padding == "SAME":  # TensorFlow's SAME padding, as tf2xla computes it
            total = max((-(-n // s) - 1) * s + (k - 1) * r + 1 - n, 0)
            low, high = total // 2, total - total // 2
        elif padding == "EXPLICIT" and len(explicit) == 2 * (spatial + 2):
            axis = d + 2 if channels_first else d + 1
            low, high = explicit[2 * axis], explicit[2 * axis + 1]
        else:
            low = high = 0
        if k == n and low == high == 0 and s == 1 and r == 1:
            continue  # the window covers the whole input: a contraction, no window
        kernel_points *= k
        swapped_points *= k if (n == 1 and s == 1 and r == 1 and low == high == k - 1) else n
    return kernel_points > swapped_points


def _attr(op: Any, key: str, default: Any) -> Any:
    """A NodeDef attribute of ``op`` as a Python value (a string, or a list of ints), ``default`` where absent."""
    attrs = op.attrs
    if not attrs or key not in attrs:
        return default
    value = attrs[key]
    if value.HasField("list"):
        return list(value.list.i)
    if value.HasField("s"):
        return value.s.decode()
    return default


#: :data:`RULES`' name for :func:`swaps_conv_operands`.
SWAPPED_CONV = "swapped-conv"
#: Each rule by name: ``(picks(op, input TensorInfos), why the op stays out)``.
RULES: dict[str, tuple[Callable[[Any, Sequence[Any]], bool], str]] = {
    SWAPPED_CONV: (swaps_conv_operands, "XLA:CPU swaps this convolution's operands (its kernel's window exceeds its "
                                        "input) and reverses its kernel into a copy XLA:GPU does not make"),
}


def check_rules(names: Sequence[str], *, what: str = "xla_left_out_rules") -> tuple[str, ...]:
    """``names``, sorted and deduplicated, each a key of :data:`RULES` (else a :class:`ConfigError` naming it)."""
    if isinstance(names, str):
        raise ConfigError(f"{what} must be a list of rule names, got the string {names!r}")
    unknown = sorted(set(names) - set(RULES))
    if unknown:
        raise ConfigError(f"{what}: unknown rules {unknown}; known: {sorted(RULES)}")
    return tuple(sorted(set(names)))


def left_out_by(rules: Sequence[str], op: Any, inputs: Sequence[Any]) -> str | None:
    """Why the first of ``rules`` that picks ``op`` (its inputs' ``TensorInfo``: ``inputs``) leaves it out, or
    ``None``."""
    for name in rules:
        picks, why = RULES[name]
        if picks(op, inputs):
            return why
    return None
