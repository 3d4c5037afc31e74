"""Fixtures shared by the test files."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

TOOLS = pathlib.Path(__file__).resolve().parents[1] / "tools"
#: seconds for ``pip install`` of tf-keras (one small pure-Python wheel).
PIP_TIMEOUT_S = 300


@pytest.fixture()
def load_tool(monkeypatch):
    """``load_tool("bench_rewrite")``: a script of tools/ imported as a module for this test only."""
    def load(name: str):
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", TOOLS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
        spec.loader.exec_module(module)
        return module
    return load


def _tf_minor() -> str:
    import tensorflow as tf
    return ".".join(tf.__version__.split(".")[:2])


def _installed_tf_keras_matches(minor: str) -> bool:
    if importlib.util.find_spec("tf_keras") is None:
        return False
    try:
        return ".".join(importlib.metadata.version("tf-keras").split(".")[:2]) == minor
    except importlib.metadata.PackageNotFoundError:
        return False


def tf_keras_dir(cache_root: pathlib.Path) -> pathlib.Path | None:
    """Where ``tf_keras`` for this TensorFlow is (``None``: already importable), installing it there if needed."""
    minor = _tf_minor()
    if _installed_tf_keras_matches(minor):
        return None
    target = cache_root / f"tf-keras-{minor}"
    if (target / "tf_keras" / "__init__.py").is_file():
        return target
    staging = cache_root / f"tf-keras-{minor}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps",
               "--target", str(staging), f"tf-keras=={minor}.*"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(command)} took over {PIP_TIMEOUT_S} s")
    if done.returncode != 0 or not (staging / "tf_keras" / "__init__.py").is_file():
        pytest.fail(f"could not install tf-keras {minor} for the tf_keras tests ({' '.join(command)} exited "
                    f"{done.returncode}); these tests need the package index, as the install of tflms does:\n"
                    f"{done.stderr[-2000:]}")
    try:
        staging.rename(target)  # atomic; another run may have won the race, then its copy is used
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target


@pytest.fixture(scope="session")
def tf_keras_path(request, tmp_path_factory) -> pathlib.Path | None:
    """The directory to put on ``sys.path`` / ``PYTHONPATH`` for ``import tf_keras`` (``None``: importable as is).

    tf_keras (Keras 2) is not a dependency of tflms, and its wheel requires the full ``tensorflow`` package, which
    would clash with ``tensorflow-cpu`` (one import package, two distributions). So the tests that need it install
    the release of this TensorFlow's ``major.minor`` once, with ``pip install --no-deps --target``, into pytest's
    cache directory (``.pytest_cache/d/tflms-tf-keras/``; a temporary one under ``-p no:cacheprovider``).
    """
    cache = getattr(request.config, "cache", None)
    root = pathlib.Path(cache.mkdir("tflms-tf-keras")) if cache is not None else tmp_path_factory.mktemp("tf-keras")
    return tf_keras_dir(root)


# ------------------------------------------------------------------------------------------- real models, the sweep
def pytest_addoption(parser):
    parser.addoption("--real-models", action="store_true",
                     help="run the tests marked real_model (keras.applications models, minutes each); CI runs them "
                          "after the README's test command: python -m pytest -n 2 --real-models --sweep "
                          "-m 'real_model or sweep'")
    parser.addoption("--sweep", action="store_true",
                     help="run the tests marked sweep (the budget sweep's cases, a fresh process per run: about 9 "
                          "minutes of one core); CI runs them with the real-model tests")


#: Marker -> (the option that runs its tests, why they are skipped without it).
_OPT_IN = {"real_model": ("--real-models", "a keras.applications model"),
           "sweep": ("--sweep", "the budget sweep, a fresh process per run")}


def pytest_collection_modifyitems(config, items):
    """Skip the ``real_model`` tests unless ``--real-models``, and the ``sweep`` tests unless ``--sweep``:
    keras.applications models take 20 s to 150 s each, and the budget sweep's cases (tests/test_budget_sweep.py) about 9
    minutes of one core in one fixture, and the README's test command must stay within its 15 minutes on two cores
    (small models in tests, large ones in benchmarks). They stay tests, and CI runs them: ``.ci/run`` after the README's
    command, ``.ci/versions`` the real models on the oldest minor (docs/developer.md)."""
    for marker, (option, what) in _OPT_IN.items():
        if config.getoption(option):
            continue
        skip = pytest.mark.skip(reason=f"{what}: run with {option} (CI does: .ci/run)")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


# ------------------------------------------------------------------------------------------------ the plan cache
#: What the suite sets for its whole run (and every process it starts inherits): the plan cache off, and its
#: directory a fresh temporary one.
_PLAN_CACHE_ENV: dict[str, str | None] = {}


def pytest_configure(config):
    """Turn tflms's plan cache (``tflms.tune.plancache``) off for the whole run, before anything is collected.

    Tests tune the same small steps again and again, in one process and in the ones they start: a cache shared
    between them would hand a test the plan another test tuned (a test that counts candidates, or monkeypatches
    the tuner, would then see none), and would write into the user's ``~/.cache/tflms``. So ``TFLMS_PLAN_CACHE=0``
    (the cache is off where ``LMSConfig.plan_cache`` is left at ``None``, as every other test leaves it), and
    ``TFLMS_CACHE_DIR`` a temporary directory removed at the end, for a test that turns it on with
    ``plan_cache=True``. The cache's own tests (``test_plan_cache.py``) give each test its own directory.
    Set here rather than in a fixture so that module-scoped fixtures and collection see it too.
    """
    import tempfile
    for name in ("TFLMS_PLAN_CACHE", "TFLMS_CACHE_DIR"):
        _PLAN_CACHE_ENV[name] = os.environ.get(name)
    os.environ["TFLMS_PLAN_CACHE"] = "0"
    os.environ["TFLMS_CACHE_DIR"] = tempfile.mkdtemp(prefix="tflms-test-plan-cache-")


def pytest_unconfigure(config):
    directory = os.environ.get("TFLMS_CACHE_DIR")
    if _PLAN_CACHE_ENV and directory and pathlib.Path(directory).name.startswith("tflms-test-plan-cache-"):
        shutil.rmtree(directory, ignore_errors=True)
    for name, value in _PLAN_CACHE_ENV.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _PLAN_CACHE_ENV.clear()


@pytest.fixture(scope="module")
def cnn_graph():
    """A traced residual CNN training step (Keras, batch norm, max pool), read with ``tflms.load_graph``: ``(graph,
    (model, optimizer))``, the model and optimizer kept alive with it (tests/test_incremental.py, test_cut_bound.py)."""
    keras = pytest.importorskip("keras")
    import tensorflow as tf

    from tflms.ir.tf_io import load_graph
    from tflms.testing import make_train_step
    from tflms.testing.models import residual_bn

    model = residual_bn(seed=0, size=16, filters=8, blocks=2)
    optimizer = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
    optimizer.build(model.trainable_variables)
    step = tf.function(make_train_step(model, optimizer))
    graph = load_graph(step, tf.TensorSpec((8, 16, 16, 3), tf.float32), tf.TensorSpec((8,), tf.int32))
    return graph, (model, optimizer)
