"""The supported TensorFlow/Keras range: one check at import, and one statement of it everywhere it is declared."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import tflms
from tflms._compat import versions
from tflms.errors import TflmsError, UnsupportedVersionError

ROOT = pathlib.Path(tflms.__file__).parent.parent


def test_the_installed_pair_is_supported():
    tf_version, keras_version = versions.installed()
    import keras
    import tensorflow as tf
    assert (tf_version, keras_version) == (tf.__version__, keras.__version__)
    versions.check(tf_version, keras_version)  # the suite runs here, so this pair must pass


@pytest.mark.parametrize("tf_version, keras_version, says", [
    ("2.15.1", "2.15.0", "TensorFlow 2.15.1 is not one of them"),
    ("2.22.0", "3.15.1", "TensorFlow 2.22.0 is not one of them"),
    ("2.22.0.dev20261101", "3.15.1", "TensorFlow 2.22.0.dev20261101 is not one of them"),
    ("2.16.2", "3.3.3", "TensorFlow 2.16 is tested with Keras 3.15 only"),
    ("2.21.0", "3.16.0", "TensorFlow 2.21 is tested with Keras 3.15 only"),
    ("2.21.0", "2.15.0", "TensorFlow 2.21 is tested with Keras 3.15 only"),
])
def test_an_unsupported_pair_names_what_was_found_and_the_range(tf_version, keras_version, says):
    with pytest.raises(UnsupportedVersionError) as err:
        versions.check(tf_version, keras_version)
    message = str(err.value)
    assert f"found TensorFlow {tf_version} with Keras {keras_version}" in message
    assert "supports TensorFlow 2.16 to 2.21 with Keras 3.15" in message
    assert says in message
    assert "pip install 'tensorflow-cpu>=2.16,<2.22' 'keras>=3.15,<3.16'" in message
    assert isinstance(err.value, TflmsError) and isinstance(err.value, ImportError)


@pytest.mark.parametrize("tf_version", ["2.16.1", "2.16.2", "2.18.0", "2.20.0", "2.21.0", "2.21.0rc1"])
def test_every_supported_minor_passes_with_its_keras(tf_version):
    versions.check(tf_version, "3.15.1")
    versions.check(tf_version, None)  # no Keras installed: TensorFlow alone is judged
    versions.check(None, None)  # no TensorFlow: tflms's pure-Python parts import without it


def _import_with(tf_version: str, keras_version: str, statement: str) -> subprocess.CompletedProcess:
    """Run ``statement`` in a fresh Python where ``tensorflow`` and ``keras`` are already imported with these
    versions (stand-ins in sys.modules: the check reads the imported modules' versions before any metadata)."""
    code = (f"import sys, types\n"
            f"sys.modules['tensorflow'] = types.SimpleNamespace(__version__={tf_version!r})\n"
            f"sys.modules['keras'] = types.SimpleNamespace(__version__={keras_version!r})\n"
            f"{statement}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("statement", ["import tflms", "import tflms.keras", "from tflms import function"])
def test_every_entry_point_fails_at_import_on_an_unsupported_version(statement):
    ran = _import_with("2.15.1", "3.3.3", statement)
    assert ran.returncode != 0
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("tflms.errors.UnsupportedVersionError: tflms supports TensorFlow 2.16 to 2.21"), ran.stderr
    assert "found TensorFlow 2.15.1 with Keras 3.3.3" in last
    # raised by the check at import, before any module that uses TensorFlow is loaded
    assert "tflms/__init__.py" in ran.stderr and "_check_versions()" in ran.stderr


def test_a_supported_version_imports_without_loading_tensorflow():
    ran = _import_with("2.16.2", "3.15.1", "import tflms; print(type(sys.modules['tensorflow']).__name__)")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "SimpleNamespace"  # the stand-in: the check imported no TensorFlow of its own


def test_the_check_reads_installed_metadata_without_importing_tensorflow():
    code = "import sys, tflms; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["False", "False"]  # import tflms stays light: versions come from the metadata


# ------------------------------------------------ one range, stated everywhere
def _declared(requirement_prefix: str, extra: list[str]) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(lowest, first excluded)`` minor of the requirement in ``extra`` that starts with ``requirement_prefix``."""
    [req] = [r for r in extra if r.startswith(requirement_prefix)]
    found = re.fullmatch(re.escape(requirement_prefix) + r">=(\d+)\.(\d+),<(\d+)\.(\d+)", req)
    assert found, f"{req!r} is not '{requirement_prefix}>=A.B,<C.D'"
    low_major, low_minor, high_major, high_minor = map(int, found.groups())
    return (low_major, low_minor), (high_major, high_minor)


def test_pyproject_declares_the_supported_range_in_both_extras():
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    tfs = sorted(versions.SUPPORTED)
    kerases = sorted({k for ks in versions.SUPPORTED.values() for k in ks})
    for name, tf_name in (("cpu", "tensorflow-cpu"), ("gpu", "tensorflow[and-cuda]")):
        assert _declared(tf_name, extras[name]) == (tfs[0], (tfs[-1][0], tfs[-1][1] + 1)), extras[name]
        assert _declared("keras", extras[name]) == (kerases[0], (kerases[-1][0], kerases[-1][1] + 1)), extras[name]
    # every minor in the declared range is one CI tests
    assert tfs == [(2, minor) for minor in range(tfs[0][1], tfs[-1][1] + 1)]


def test_the_guide_states_the_supported_range():
    guide = (ROOT / "docs" / "guide.md").read_text()
    assert f"tflms supports {versions.supported_range()}" in guide
    for (major, minor), kerases in versions.SUPPORTED.items():
        row = re.search(rf"^\| TensorFlow {major}\.{minor} \| (.*?) \|", guide, re.M)
        assert row, f"docs/guide.md's version table has no row for TensorFlow {major}.{minor}"
        assert row[1] == ", ".join(f"Keras {k[0]}.{k[1]}" for k in kerases)


def test_ci_runs_every_older_minor_and_a_newer_python():
    script = (ROOT / ".ci" / "versions").read_text()
    listed = re.search(r"^ENVIRONMENTS=\((.*?)\)$", script, re.M | re.S)
    assert listed, ".ci/versions names its environments in ENVIRONMENTS=(...)"
    runs = {(tuple(int(p) for p in tf.split(".")), python)
            for tf, python in re.findall(r'"(2\.\d+) \$(PYTHON3\d+)"', listed[1])}
    newest = max(versions.SUPPORTED)
    assert runs == {(minor, "PYTHON311") for minor in versions.SUPPORTED if minor != newest} | {(newest, "PYTHON312")}
    assert "bash .ci/versions" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_command_skips_the_real_models_and_ci_runs_them():
    """The keras.applications tests (``real_model``) and the budget sweep's cases (``sweep``) are skipped by the
    README's command, run by ``--real-models`` and ``--sweep``, and CI runs them right after that command
    (tests/conftest.py)."""
    sweep = "test_the_sweep_trains_bitwise_or_refuses_recomputes_alone_and_rewrites_something_in_every_case"
    for node, option in (("tests/test_zoo.py::test_resnet50_fit_at_96_is_bitwise", "--real-models"),
                         (f"tests/test_budget_sweep.py::{sweep}", "--sweep")):
        skipped = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", node],
                                 cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert skipped.returncode == 0 and "1 skipped" in skipped.stdout and option in skipped.stdout, \
            skipped.stdout[-2000:]  # (collected and skipped, not deselected: the README's user sees they exist)
    ci = (ROOT / ".ci" / "run").read_text()
    second = ci.index('--real-models --sweep -m "real_model or sweep"')
    assert ci.index("$cmd\"") < second < ci.index("bash .ci/versions")
    assert "--real-models" in (ROOT / ".ci" / "versions").read_text()  # BITWISE's MobileNet is one
