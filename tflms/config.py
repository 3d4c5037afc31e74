"""The rewrite configuration: a frozen, validated record.

Parameter names follow IBM's TFLMS so its users feel at home. Every field is
checked when the config is built; a bad or contradictory value raises
:class:`~tflms.errors.ConfigError` naming the field and the fix.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from tflms.devices import normalize_device
from tflms.errors import ConfigError
from tflms.units import parse_bytes

#: ``compress`` values: no compression, CSwap+'s per-tensor choice, or one codec for every swapped tensor
#: (the names of :data:`tflms.compress.codecs.CODEC_NAMES`; ``fp16``, ``bf16`` and ``int8`` are lossy).
COMPRESS_AUTO = "auto"
COMPRESS_CODECS = ("zvc", "fp16", "bf16", "int8-block")
#: Short names accepted for codecs.
COMPRESS_ALIASES = {"int8": "int8-block"}

#: ``recompute`` values: swap or recompute per tensor (the default), swap only, recompute only.
RECOMPUTE_AUTO, RECOMPUTE_OFF, RECOMPUTE_ONLY = "auto", "off", "only"
RECOMPUTE_MODES = (RECOMPUTE_AUTO, RECOMPUTE_OFF, RECOMPUTE_ONLY)

#: sync_mode values (TFLMS): which copies the computation waits for.
SYNC_NONE, SYNC_SWAP_OUT, SYNC_SWAP_IN, SYNC_BOTH = 0, 1, 2, 3

#: The TFLMS rule parameters, and the value each takes when some other rule parameter is given and it is not.
RULE_DEFAULTS = {"swapout_threshold": 1, "swapin_ahead": 1, "swapin_groupby": 0, "sync_mode": SYNC_NONE}

@dataclasses.dataclass(frozen=True)
class LMSConfig:
    """What to swap and how (TFLMS semantics).

    The default: with no rule parameter (``swapout_threshold``, ``swapin_ahead``,
    ``swapin_groupby``, ``sync_mode``) and no ``budget``/``profile``, tflms
    tunes for the accelerator's memory: this machine's GPU (its memory, and the
    closest hardware profile for the costs), or without a GPU the chosen
    profile's memory (the report says which). A step that fits is left alone; one
    that does not gets the fastest rewrite that fits. Giving any rule parameter
    selects the TFLMS rules instead, the others at :data:`RULE_DEFAULTS`.

    Attributes:
      swapout_threshold: a tensor is swapped out for those consumers whose level
        distance from its producer exceeds this many levels (>= 1). ``None``
        (the default for all four rule parameters): not given.
      swapin_ahead: the swap-in is triggered by an op this many levels before its
        first consumer (>= 1); larger prefetches earlier.
      swapin_groupby: consumers within this many levels of the group's first
        consumer share one swap-in (>= 0).
      sync_mode: 0 asynchronous copies; 1 the tensor's remaining forward
        consumers wait for the swap-out; 2 swap-ins are triggered right before
        their consumer (no prefetch); 3 both.
      include_types / exclude_types: only / never swap outputs of these op types.
      include_scopes / exclude_scopes: only / never swap outputs of ops under these
        name scopes ("model/block1", matched as a path prefix).
      min_swap_bytes: never swap tensors smaller than this (int bytes or "1MiB").
      host_device: where swapped tensors live ("/device:CPU:0").
      accelerator_device: where swap-ins go; ``None`` means the first GPU, or the
        CPU (with a warning that nothing will be saved) when there is none.
      batch_size: resolves an unknown leading dimension when sizing tensors.
      budget_bytes: accelerator memory budget (int bytes or "12GiB"; alias
        ``budget``). Giving a budget or a profile turns on auto-tuning: the swap
        parameters above are then searched (see :mod:`tflms.tune`).
      profile: hardware profile to simulate (e.g. "v100-16gb-pcie3"); the budget
        defaults to its memory. Default when tuning: ``v100-16gb-pcie3``.
      fit_by: how the tuner judges "fits": ``"live"`` (the simulated live-bytes
        peak) or ``"bfc"`` (what TensorFlow's BFC allocator, modelled, reserves).
      compress: compress swapped tensors before their copy: ``None`` (never),
        ``"zvc"`` (zero-value compression, lossless: training stays bitwise),
        ``"fp16"`` / ``"bf16"`` / ``"int8"`` (= ``"int8-block"``; lossy: naming one accepts that
        swapped activations lose precision), or ``"auto"`` (CSwap+: per tensor,
        the lossless codec only where the simulator says it makes the step
        faster, from sparsity measured on the first batch).
      enforce_order: pin a memory-aware execution order with control edges after the swaps, the
        compression and the placement (:func:`tflms.passes.order.enforce_order`; docs/design.md,
        "Enforced order"): ``None`` (default) means on when tuning (a budget or profile is given) and off
        otherwise; ``True`` always (simulated on the profile, ``v100-16gb-pcie3`` when none is given);
        ``False`` never. The edges are added only when the graph with them peaks lower in the simulator
        than without and, when tuning, only if the winning candidate was judged with them; they never
        change values (training stays bitwise).
      tf32: how the simulator prices float32 contractions (MatMul, Conv, Einsum, ...) on a profile whose
        GPU has TF32 tensor cores (A100 and newer): ``True`` at the TF32 rate, ``False`` at the FP32 rate,
        ``None`` (default) as TensorFlow will run them, read from
        ``tf.config.experimental.tensor_float_32_execution_enabled()`` when the rewrite runs. It prices
        only: tflms never changes TensorFlow's setting. The report says which applied.
      recompute: what the tuner may do besides swapping (:mod:`tflms.policies.recompute`): ``"auto"``
        (default) re-runs forward ops in the backward pass where that beats a copy, alone or beside swaps;
        ``"off"`` swaps only; ``"only"`` recomputes only, with no host copies (for hosts whose link or pinned
        memory is taken). Recompute re-runs ops exactly (stateless ones only), so training stays bitwise.
      plan_cache: where the tuner keeps the plans it chose (:mod:`tflms.tune.plancache`), so that a restart
        or another fit of the same step, budget and profile reuses its plan instead of tuning again:
        ``None`` (default) the cache directory ``$TFLMS_CACHE_DIR``, else ``$XDG_CACHE_HOME/tflms``
        (``~/.cache/tflms``), unless the environment variable ``TFLMS_PLAN_CACHE=0`` turns it off;
        ``False`` never read or write it; ``True`` on, at that directory, whatever ``TFLMS_PLAN_CACHE``
        says; a path: on, at that directory. Only tuned rewrites use it.
    """

    swapout_threshold: int | None = None
    swapin_ahead: int | None = None
    swapin_groupby: int | None = None
    sync_mode: int | None = None
    include_types: tuple[str, ...] = ()
    exclude_types: tuple[str, ...] = ()
    include_scopes: tuple[str, ...] = ()
    exclude_scopes: tuple[str, ...] = ()
    min_swap_bytes: int = 0
    host_device: str = "/device:CPU:0"
    accelerator_device: str | None = None
    batch_size: int | None = None
    budget_bytes: int | None = None
    profile: str | None = None
    fit_by: str = "live"
    compress: str | None = None
    enforce_order: bool | None = None
    tf32: bool | None = None
    recompute: str = "auto"
    plan_cache: bool | str | None = None
    #: ``LMSConfig(budget="12GiB")``: the alias of ``budget_bytes`` (as in tflms.function and the Keras callback).
    budget: dataclasses.InitVar[int | str | None] = None

    def __post_init__(self, budget: int | str | None = None) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass normalisation
        if budget is not None:
            if self.budget_bytes is not None:
                raise ConfigError("give budget or budget_bytes, not both")
            set_("budget_bytes", budget)
        for name, low in (("swapout_threshold", 1), ("swapin_ahead", 1), ("swapin_groupby", 0)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name} must be an int (levels), got {value!r}")
            if value < low:
                raise ConfigError(f"{name} must be >= {low} levels, got {value}")
        if self.sync_mode not in (None, SYNC_NONE, SYNC_SWAP_OUT, SYNC_SWAP_IN, SYNC_BOTH) or isinstance(
                self.sync_mode, bool):
            raise ConfigError(f"sync_mode must be 0 (none), 1 (swap-out), 2 (swap-in) or 3 (both), "
                              f"got {self.sync_mode!r}")
        for name in ("include_types", "exclude_types", "include_scopes", "exclude_scopes"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            value = tuple(value)
            if not all(isinstance(v, str) and v for v in value):
                raise ConfigError(f"{name} must be a list of non-empty strings, got {value!r}")
            if name.endswith("scopes"):
                value = tuple(v.rstrip("/") for v in value)
            set_(name, tuple(sorted(set(value))))
        both = set(self.include_types) & set(self.exclude_types)
        if both:
            raise ConfigError(f"op types {sorted(both)} are both included and excluded; keep them in one list")
        both = set(self.include_scopes) & set(self.exclude_scopes)
        if both:
            raise ConfigError(f"scopes {sorted(both)} are both included and excluded; keep them in one list")
        set_("min_swap_bytes", parse_bytes(self.min_swap_bytes, what="min_swap_bytes"))
        set_("host_device", normalize_device(self.host_device, field="host_device"))
        if self.accelerator_device is not None:
            set_("accelerator_device", normalize_device(self.accelerator_device, field="accelerator_device"))
            if self.accelerator_device == self.host_device:
                raise ConfigError(f"accelerator_device and host_device are both {self.host_device!r}: swapping "
                                  "to the same device saves nothing; give two different devices")
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or not isinstance(
                self.batch_size, int) or self.batch_size <= 0):
            raise ConfigError(f"batch_size must be a positive int, got {self.batch_size!r}")

        if self.budget_bytes is not None:
            set_("budget_bytes", parse_bytes(self.budget_bytes, what="budget"))
            if self.budget_bytes == 0:
                raise ConfigError("budget must be positive, e.g. '12GiB'")
        if self.profile is not None:
            from tflms.profiles import get_profile
            get_profile(self.profile)  # raises ConfigError naming the known profiles
        set_("compress", COMPRESS_ALIASES.get(self.compress, self.compress))
        if self.compress is not None and self.compress not in (COMPRESS_AUTO,) + COMPRESS_CODECS:
            raise ConfigError(f"compress must be None, {COMPRESS_AUTO!r} or a codec name "
                              f"({', '.join(COMPRESS_CODECS)}), got {self.compress!r}")
        if self.enforce_order is not None and not isinstance(self.enforce_order, bool):
            raise ConfigError(f"enforce_order must be None (on when tuning), True or False, got {self.enforce_order!r}")
        if self.tf32 is not None and not isinstance(self.tf32, bool):
            raise ConfigError(f"tf32 must be None (as TensorFlow's tensor_float_32_execution), True or False, "
                              f"got {self.tf32!r}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute must be one of {', '.join(map(repr, RECOMPUTE_MODES))} (auto: swap or "
                              f"recompute per tensor; off: swap only; only: recompute only), got {self.recompute!r}")
        if self.fit_by not in ("live", "bfc"):
            raise ConfigError(f"fit_by must be 'live' or 'bfc', got {self.fit_by!r}")
        if self.plan_cache is not None and not isinstance(self.plan_cache, bool):
            where = os.fspath(self.plan_cache) if isinstance(self.plan_cache, (str, os.PathLike)) else None
            if not isinstance(where, str) or not where:
                raise ConfigError(f"plan_cache must be None (the default cache directory), False (off), True (on) "
                                  f"or a directory, got {self.plan_cache!r}")
            set_("plan_cache", where)

    @property
    def rules_given(self) -> bool:
        """True when any TFLMS rule parameter was given (they select the rules unless a budget or profile is)."""
        return any(getattr(self, name) is not None for name in RULE_DEFAULTS)

    @property
    def auto_tune(self) -> bool:
        """True when the tuner chooses the swap parameters: a budget or profile, or no rule parameter, was given."""
        return self.budget_bytes is not None or self.profile is not None or not self.rules_given

    @property
    def default_tuning(self) -> bool:
        """True for the default: tuning for the accelerator's own memory (no rule parameter, budget or profile)."""
        return self.budget_bytes is None and self.profile is None and not self.rules_given

    def with_rule_defaults(self) -> "LMSConfig":
        """This config with every rule parameter not given at its :data:`RULE_DEFAULTS` value."""
        missing = {k: v for k, v in RULE_DEFAULTS.items() if getattr(self, k) is None}
        return dataclasses.replace(self, **missing) if missing else self

    @property
    def orders(self) -> bool:
        """Whether the pipeline runs the order pass (``enforce_order``, or tuning when it is ``None``)."""
        return self.auto_tune if self.enforce_order is None else self.enforce_order

    @property
    def sync_swap_out(self) -> bool:
        return self.sync_mode in (SYNC_SWAP_OUT, SYNC_BOTH)

    @property
    def sync_swap_in(self) -> bool:
        return self.sync_mode in (SYNC_SWAP_IN, SYNC_BOTH)

    def replace(self, **changes: Any) -> "LMSConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_kwargs(cls, config: "LMSConfig | None" = None, **kwargs: Any) -> "LMSConfig":
        """Build from a base config plus keyword overrides (unknown names are an error).

        ``budget`` is accepted as an alias of ``budget_bytes``.
        """
        if "budget" in kwargs:
            if "budget_bytes" in kwargs:
                raise ConfigError("give budget or budget_bytes, not both")
            kwargs["budget_bytes"] = kwargs.pop("budget")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - fields)
        if unknown:
            import difflib
            hints = [difflib.get_close_matches(u, fields, n=1) for u in unknown]
            hint = "; ".join(f"{u!r}: did you mean {h[0]!r}?" for u, h in zip(unknown, hints) if h)
            raise ConfigError(f"unknown tflms option(s) {unknown}. {hint}".strip())
        base = config or cls()
        return dataclasses.replace(base, **kwargs) if kwargs else base

    @classmethod
    def from_options(cls, config: "LMSConfig | None", options: dict[str, Any],
                     unknown: dict[str, Any] | None = None) -> "LMSConfig":
        """Build from the named keyword arguments of an entry point (``tflms.keras.LMS``, ``tflms.function``).

        ``options`` maps :func:`option_names` to values; ``None`` means "not given": the value of
        ``config``, or the field's default. ``unknown`` holds any other keyword the caller received;
        a misspelt name is refused with the closest option's name.
        """
        given = {k: v for k, v in options.items() if v is not None}
        return cls.from_kwargs(config, **given, **(unknown or {}))


def option_names() -> tuple[str, ...]:
    """The keyword names the entry points take for :class:`LMSConfig`'s fields, in field order.

    ``budget`` stands for ``budget_bytes`` (the field keeps the unit in its name; the
    entry points take ``"12GiB"`` or bytes under the shorter name).
    """
    return tuple("budget" if f.name == "budget_bytes" else f.name for f in dataclasses.fields(LMSConfig))
