"""The plan cache: a tuned plan kept on disk, so a restart or another fit of the same step reuses it (issue 48).

Tuning a large step takes minutes (the simulator judges hundreds of candidate rewrites), and it ran again on
every restart and every new input signature. :func:`cached_tune` stands where the pipeline calls
:func:`tflms.tune.tuner.tune`: it looks the plan up first, and tunes (and stores the winner) only on a miss.

**Key.** An entry is keyed by everything the tuner's choice depends on (:func:`plan_key`):

- the step's graph as the tuner sees it, after grappler's pre-pass: :func:`tflms.ir.fingerprint.graph_digest`
  (ops, types, attributes, shapes, dtypes, edges, devices, the signature);
- the hardware profile, every field of it as priced (its TF32 setting included), and the budget in bytes;
- the whole :class:`~tflms.config.LMSConfig` but ``plan_cache`` (filters, devices, ``min_swap_bytes``,
  ``batch_size``, ``fit_by``, ``recompute``, ``compress``, ``enforce_order``, ...) and the tuner's arguments
  (copy op, strategies, ...);
- this machine's part: the device swap-ins are planned for, and whether the CPU runs oneDNN's kernels;
- the versions: the cache format, tflms's version and a digest of its own source files (a changed checkout
  tunes again), and TensorFlow's.

Any change to any of them is another key, so it tunes again; nothing is ever invalidated in place.

**On disk.** ``<cache dir>/plans/<key digest>.json``, one JSON object per key (no pickle): the key itself
(checked on read), the plan (:func:`encode_plan`), the order edges the winner had before its swaps, the
winner's order record and predictions, the tuner's summary (``TuneResult.to_dict()``), the time the tune
took, and the digest of the rewritten graph. The cache directory is ``LMSConfig.plan_cache`` when it names
one, else ``$TFLMS_CACHE_DIR``, else ``$XDG_CACHE_HOME/tflms`` (``~/.cache/tflms``). ``plan_cache=False``, or
``TFLMS_PLAN_CACHE=0`` in the environment (when ``plan_cache`` is left at ``None``), turns it off.

**Exactly the same rewrite.** A hit rebuilds the rewritten graph from the stored plan with the same passes
(deterministic) and compares its digest with the stored one; a plan is stored only once that rebuild was
checked to give the tuned graph, op for op, edge for edge. A hit therefore gives the graph a fresh tune gives.

**Never in the way.** Entries are written through :func:`tflms.atomicfs.write_file_atomic` (a hidden
temporary file and one rename): concurrent writers leave one whole entry, readers never see half of one. An
entry that cannot be read, is not JSON, was written for another key or format, or does not rebuild its graph
is ignored (logged), tuned again and overwritten; a cache directory that cannot be written costs the entry,
not the fit. The report's ``tuning["plan_cache"]`` says what happened (:data:`HIT`, :data:`STORED`, ...).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tflms.analysis.cto import Analysis
from tflms.config import COMPRESS_AUTO, LMSConfig
from tflms.ir.graph import Graph
from tflms.policies.swapplan import SwapPlan

from tflms.tune.plancodec import _ref, _unref, encode_plan, decode_plan, rebuild_graph, _recomputed, edges_added, _recipe  # noqa: F401 - re-exported

logger = logging.getLogger(__name__)

#: The entry format; part of the key (an entry of another format is another key).
FORMAT = 1
#: The cache directory (``LMSConfig.plan_cache`` naming a directory comes first).
ENV_DIR = "TFLMS_CACHE_DIR"
#: ``0`` / ``off`` / ``false`` / ``no`` turn the cache off where ``LMSConfig.plan_cache`` is ``None``.
ENV_SWITCH = "TFLMS_PLAN_CACHE"
_OFF_WORDS = frozenset({"0", "off", "false", "no"})
#: The subdirectory of the cache directory that holds the plans.
PLANS = "plans"

#: ``tuning["plan_cache"]["status"]``: the plan came from the cache; the tune ran and its plan was stored; the
#: cache is off; this tune cannot be cached; the tune ran but its plan could not be stored.
HIT, STORED, OFF, NOT_USED, NOT_STORED = "hit", "stored", "off", "not-used", "not-stored"


# ------------------------------------------------------------------------------------------------ settings

@dataclasses.dataclass(frozen=True)
class CacheSettings:
    """Where plans are kept (``directory``, ``None`` when the cache is off) and why, in words."""

    directory: Path | None
    why: str

    @property
    def enabled(self) -> bool:
        return self.directory is not None


def default_directory(environ: dict[str, str] | None = None) -> Path:
    """``$TFLMS_CACHE_DIR``, else ``$XDG_CACHE_HOME/tflms``, else ``~/.cache/tflms``."""
    env = os.environ if environ is None else environ
    if env.get(ENV_DIR):
        return Path(env[ENV_DIR]).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg and os.path.isabs(os.path.expanduser(xdg)) else Path.home() / ".cache"
    return base / "tflms"


def settings(config: LMSConfig | None, environ: dict[str, str] | None = None) -> CacheSettings:
    """The cache settings ``config.plan_cache`` and the environment give (see the module doc)."""
    env = os.environ if environ is None else environ
    given = None if config is None else config.plan_cache
    if given is False:
        return CacheSettings(None, "off: plan_cache=False")
    if isinstance(given, str):
        return CacheSettings(Path(given).expanduser(), "plan_cache names the directory")
    if given is None and env.get(ENV_SWITCH, "").strip().lower() in _OFF_WORDS:
        return CacheSettings(None, f"off: {ENV_SWITCH}={env[ENV_SWITCH]}")
    where = f"{ENV_DIR}" if env.get(ENV_DIR) else "the default directory"
    return CacheSettings(default_directory(env), where)


# ------------------------------------------------------------------------------------------------ the key

@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """SHA-256 of tflms's own ``.py`` files (names and contents): a checkout with other code is another key."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _tflms_version() -> str:
    """The installed distribution's version (the package itself sits in a layer above this one); the source digest
    keys the code that runs, installed or not."""
    import importlib.metadata
    try:
        return importlib.metadata.version("tflms")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _tensorflow_version() -> str:
    import tensorflow as tf
    return tf.__version__


def _jsonable(value: Any) -> Any:
    """``value`` with tuples as lists and mappings with string keys, as JSON gives them back."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def plan_key(analysis: Analysis, *, budget_bytes: int, host_budget_bytes: int, profile: Any, config: LMSConfig,
             copy_op: str, fit_by: str, enforce_order: bool, require_backward: bool, strategies: Sequence[str],
             first_fit: bool, prune: bool, accelerator: str, sim_options: Any = None) -> dict[str, Any]:
    """Everything the tuner's choice depends on (see the module doc), as a JSON-ready mapping."""
    from tflms.devices import runs_onednn_cpu_kernels
    from tflms.ir.fingerprint import graph_digest
    options = {k: v for k, v in config.to_dict().items() if k != "plan_cache"}
    return _jsonable({
        "format": FORMAT,
        "tflms": _tflms_version(),
        "tflms_source": source_digest(),
        "tensorflow": _tensorflow_version(),
        "graph": graph_digest(analysis.graph),
        "profile": profile.to_dict(),
        "budget_bytes": int(budget_bytes),
        "host_budget_bytes": int(host_budget_bytes),
        "config": options,
        "tuner": {"copy_op": copy_op, "fit_by": fit_by, "enforce_order": bool(enforce_order),
                  "require_backward": bool(require_backward), "strategies": list(strategies),
                  "first_fit": bool(first_fit), "prune": bool(prune)},
        # the margin and the simulator's clock, among others: what a fit is judged with
        "sim_options": None if sim_options is None else dataclasses.asdict(sim_options),
        "machine": {"accelerator": accelerator, "onednn_cpu": runs_onednn_cpu_kernels(config.host_device)},
    })


def key_digest(key: dict[str, Any]) -> str:
    """The entry's name: SHA-256 of the key's canonical JSON."""
    return hashlib.sha256(_canonical(key).encode()).hexdigest()


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# ------------------------------------------------------------------------------------------------ the result

@dataclasses.dataclass(frozen=True)
class CachedSim:
    """What the pipeline and the report read of the winner's simulation, as stored."""

    peak_with_margin_bytes: int
    step_time_s: float
    host_peak_bytes: int


@dataclasses.dataclass(frozen=True)
class CachedCandidate:
    """The stored winner: its strategy, parameters, plan and order record, and its predictions."""

    strategy: str
    params: dict[str, Any]
    plan: SwapPlan | None
    sim: CachedSim
    order: dict[str, Any] | None = None
    fits: bool = True
    why_not: str = ""

    @property
    def swapped_bytes(self) -> int:
        return 0 if self.plan is None else self.plan.swapped_bytes


@dataclasses.dataclass(frozen=True)
class CachedTuneResult:
    """A plan read from the cache, in the part of :class:`~tflms.tune.result.TuneResult`'s form the pipeline reads:
    ``best`` (plan, order record, predictions), ``graph`` (rebuilt, identical to the tuned one), ``budget_bytes``,
    ``profile`` and ``to_dict()`` (the tuner's summary as stored, with ``plan_cache`` saying where it came from).
    The candidates the tune judged are not kept: ``to_dict()["candidates"]`` lists them as they were."""

    budget_bytes: int
    profile: str
    best: CachedCandidate
    graph: Graph
    analysis: Analysis
    tuning: dict[str, Any]
    plan_cache: dict[str, Any]

    @property
    def strategy(self) -> str:
        return self.best.strategy

    @property
    def overhead(self) -> float:
        return self.tuning["overhead"]

    @property
    def config(self) -> LMSConfig | None:
        return None if self.best.plan is None else self.best.plan.config

    def reason(self) -> str:
        return self.tuning["reason"]

    def to_dict(self) -> dict[str, Any]:
        return {**self.tuning, "plan_cache": dict(self.plan_cache)}


# ------------------------------------------------------------------------------------------------ on disk

class PlanCache:
    """The plans under one cache directory (``<directory>/plans/<key digest>.json``)."""

    def __init__(self, directory: os.PathLike | str):
        self.directory = Path(directory)
        self.plans = self.directory / PLANS

    def path(self, digest: str) -> Path:
        return self.plans / f"{digest}.json"

    def read(self, key: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
        """``(the entry stored for key, "")``, or ``(None, why not)``: none, unreadable, not JSON, another key."""
        path = self.path(key_digest(key))
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None, "no entry for this key"
        except (OSError, UnicodeDecodeError) as err:
            return None, f"cannot read {path}: {err}"
        try:
            entry = json.loads(text)
        except ValueError as err:
            return None, f"{path} is not JSON ({err})"
        if not isinstance(entry, dict):
            return None, f"{path} holds no entry"
        if entry.get("format") != FORMAT:
            return None, f"{path} has format {entry.get('format')!r}, not {FORMAT}"
        stored = entry.get("key")
        if _canonical(stored) != _canonical(key):
            version = stored.get("tflms") if isinstance(stored, dict) else None
            return None, f"{path} was written for another key (tflms {version!r})"
        return entry, ""

    def write(self, key: dict[str, Any], entry: dict[str, Any]) -> Path:
        """Store ``entry`` under ``key`` atomically (a concurrent writer's entry or this one wins, whole)."""
        from tflms.atomicfs import write_file_atomic
        path = self.path(key_digest(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({**entry, "format": FORMAT, "key": key}).encode("utf-8")
        write_file_atomic(path, data, replace=True)
        return path


def _load(cache: PlanCache, key: dict[str, Any], analysis: Analysis, *, config: LMSConfig, copy_op: str,
          compress: Callable[[Graph, SwapPlan], Graph] | None) -> tuple[CachedTuneResult | None, str, bool]:
    """``(the cached result, "", _)`` on a hit, else ``(None, why, whether that is worth a warning)``."""
    from tflms.ir.fingerprint import graph_digest
    start = time.perf_counter()
    entry, why = cache.read(key)
    if entry is None:
        return None, why, not why.startswith("no entry")
    path = cache.path(key_digest(key))
    try:
        plan = None if entry["plan"] is None else decode_plan(entry["plan"], config.plan_cache)
        edges = [(str(b), str(a)) for b, a in entry["pre_swap_edges"]]
        graph = rebuild_graph(analysis, plan, pre_swap_edges=edges, copy_op=copy_op,
                              compress=compress if entry["compressed"] else None)
        if graph_digest(graph) != entry["graph_digest"]:
            return None, f"{path}: its plan does not rebuild the graph it was stored with", True
        sim = CachedSim(**entry["sim"])
        tuning = dict(entry["tuning"])
        best = CachedCandidate(strategy=tuning["strategy"], params=dict(tuning["params"]), plan=plan, sim=sim,
                               order=entry["order"])
        record = {"status": HIT, "path": str(path), "key": key_digest(key), "created": entry.get("created"),
                  "tune_s": entry.get("tune_s"), "load_s": time.perf_counter() - start}
        result = CachedTuneResult(budget_bytes=int(tuning["budget_bytes"]), profile=str(tuning["profile"]),
                                  best=best, graph=graph, analysis=analysis, tuning=tuning, plan_cache=record)
    except Exception as err:  # noqa: BLE001 - a bad entry is a miss, never a failed fit
        return None, f"{path} is not a valid entry ({type(err).__name__}: {err})", True
    return result, "", False


def _entry(result: Any, *, copy_op: str, compress: Callable[[Graph, SwapPlan], Graph] | None,
           tune_s: float) -> tuple[dict[str, Any] | None, str]:
    """The entry that stores ``result`` (a :class:`~tflms.tune.result.TuneResult`), or ``(None, why not)``."""
    plan = result.best.plan
    encoded = None
    if plan is not None:
        encoded = encode_plan(plan)
        try:
            again = decode_plan(json.loads(json.dumps(encoded)), plan.config.plan_cache)
        except (KeyError, TypeError, ValueError) as err:
            return None, f"the plan does not read back from JSON ({err})"
        if again != plan:
            return None, "the plan does not read back from JSON equal to itself"
    recipe = _recipe(result, copy_op, compress)
    if recipe is None:
        return None, "its rewritten graph could not be rebuilt exactly from the plan"
    edges, compressed, digest = recipe
    sim = result.best.sim
    return {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tune_s": round(tune_s, 3),
        "plan": encoded,
        "pre_swap_edges": [list(e) for e in edges],
        "compressed": compressed,
        "graph_digest": digest,
        "order": result.best.order,
        "sim": {"peak_with_margin_bytes": sim.peak_with_margin_bytes, "step_time_s": sim.step_time_s,
                "host_peak_bytes": sim.host_peak_bytes},
        "tuning": result.to_dict(),
    }, ""


# ------------------------------------------------------------------------------------------------ the hook

def cached_tune(source: Any, *args: Any, config: LMSConfig | None = None, **kwargs: Any) -> Any:
    """:func:`tflms.tune.tuner.tune`, through the plan cache (see the module doc); same arguments, same result.

    On a hit the result is a :class:`CachedTuneResult`; otherwise the tuner's :class:`TuneResult`, its plan
    stored. Either way ``to_dict()["plan_cache"]`` says what happened. The cache is used for an
    :class:`~tflms.analysis.cto.Analysis` with the default simulator options (the pipeline's call); otherwise,
    or with ``compress="auto"`` (whose codecs follow the data of the first batch), this is ``tune``.
    """
    from tflms.tune.tuner import tune
    chosen = settings(config)
    if not chosen.enabled:
        return _with_record(tune(source, *args, config=config, **kwargs), {"status": OFF, "why": chosen.why})
    why_not = _not_cacheable(source, args, config, kwargs)
    if why_not:
        return _with_record(tune(source, *args, config=config, **kwargs), {"status": NOT_USED, "why": why_not})
    cache = PlanCache(chosen.directory)
    try:
        key = _key(source, config, kwargs)
    except Exception as err:  # noqa: BLE001 - the cache must never fail a fit
        logger.warning("tflms: plan cache not used: cannot key this tune (%s: %s)", type(err).__name__, err)
        return _with_record(tune(source, *args, config=config, **kwargs),
                            {"status": NOT_USED, "why": f"cannot key this tune: {err}"})
    copy_op, compress = kwargs.get("copy_op", _default("copy_op")), kwargs.get("compress")
    try:
        hit, why, bad = _load(cache, key, source, config=config, copy_op=copy_op, compress=compress)
    except Exception as err:  # noqa: BLE001 - the cache must never fail a fit
        hit, why, bad = None, f"cannot read the cache ({type(err).__name__}: {err})", True
    if hit is not None:
        logger.info("tflms: plan reused from the cache (%s; tuned in %.1f s when stored)", hit.plan_cache["path"],
                    hit.plan_cache["tune_s"] or 0.0)
        return hit
    (logger.warning if bad else logger.debug)("tflms: plan cache: %s; tuning again", why)
    start = time.perf_counter()
    result = tune(source, *args, config=config, **kwargs)
    tune_s = time.perf_counter() - start
    record = {"status": STORED, "path": str(cache.path(key_digest(key))), "key": key_digest(key), "miss": why}
    try:
        entry, not_stored = _entry(result, copy_op=copy_op, compress=compress, tune_s=tune_s)
        if entry is None:
            logger.info("tflms: plan not cached: %s", not_stored)
            record = {"status": NOT_STORED, "why": not_stored, "miss": why}
        else:
            cache.write(key, entry)
    except Exception as err:  # noqa: BLE001 - a cache that cannot be written costs the entry, not the fit
        logger.warning("tflms: plan not cached in %s: %s", cache.plans, err)
        record = {"status": NOT_STORED, "why": f"{type(err).__name__}: {err}", "miss": why}
    return _with_record(result, record)


def _default(name: str) -> Any:
    import inspect

    from tflms.tune.tuner import tune
    return inspect.signature(tune).parameters[name].default


def _not_cacheable(source: Any, args: Sequence[Any], config: LMSConfig | None, kwargs: dict[str, Any]) -> str:
    if not isinstance(source, Analysis) or args:
        return "the tune was given a graph, not the pipeline's analysis"
    if config is not None and config.compress == COMPRESS_AUTO:
        return "compress='auto' chooses codecs from the first batch's data, which the key does not hold"
    return ""


def _key(analysis: Analysis, config: LMSConfig | None, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The key of the tune :func:`tflms.tune.tuner.tune` would run with these arguments."""
    from tflms.devices import resolve_accelerator
    from tflms.profiles import get_profile
    from tflms.units import parse_bytes
    config = config or LMSConfig()
    profile = get_profile(kwargs.get("profile", _default("profile")))
    budget = kwargs.get("budget")
    host_budget = kwargs.get("host_budget")
    base = config.with_rule_defaults()
    accelerator = base.accelerator_device or resolve_accelerator(base.accelerator_device)[0]
    if accelerator == base.host_device:
        accelerator = "/device:GPU:0"  # (as the tuner plans for a GPU this machine has not)
    return plan_key(
        analysis, budget_bytes=profile.memory_bytes if budget is None else parse_bytes(budget, what="budget"),
        host_budget_bytes=(profile.host_memory_bytes if host_budget is None
                           else parse_bytes(host_budget, what="host_budget")),
        profile=profile, config=config, copy_op=kwargs.get("copy_op", _default("copy_op")),
        fit_by=kwargs.get("fit_by", _default("fit_by")), enforce_order=kwargs.get("enforce_order", False),
        require_backward=kwargs.get("require_backward", True),
        strategies=kwargs.get("strategies", _default("strategies")), first_fit=kwargs.get("first_fit", False),
        prune=kwargs.get("prune", True), accelerator=accelerator, sim_options=kwargs.get("sim_options"))


def _with_record(result: Any, record: dict[str, Any]) -> Any:
    """``result`` (a TuneResult) with ``record`` as its ``plan_cache`` (anything else, e.g. a test's stand-in for
    the tuner's result, as it is)."""
    if not (dataclasses.is_dataclass(result) and any(f.name == "plan_cache" for f in dataclasses.fields(result))):
        return result
    return dataclasses.replace(result, plan_cache=record)
