"""The TensorFlow and Keras versions tflms supports, and the one check that enforces them.

tflms reads TensorFlow and Keras internals that change between releases (the rest of
:mod:`tflms._compat`), so it declares only the pairs CI runs the suite on: the newest
with the README's test command, each older TensorFlow minor in a virtual environment of
its own (``.ci/versions``). :data:`SUPPORTED` is that list; ``pyproject.toml``'s extras and
docs/guide.md state the same range (``tests/test_versions.py`` keeps them in step).

:func:`check_installed` runs when ``tflms`` is imported, so ``import tflms``,
``import tflms.keras`` and ``tflms.function`` fail at once, naming the versions found
and the supported range, instead of deep in a rewrite. It does not import TensorFlow:
it reads the versions of the modules already imported, else the installed
distributions' metadata (``importlib.metadata``).
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

from tflms.errors import UnsupportedVersionError

#: Each supported TensorFlow ``(major, minor)`` and the Keras 3 ``(major, minor)`` versions tested with it.
#: Keras 3.15 is the newest Keras 3 and runs on every TensorFlow from 2.16 (its wheels require ``keras>=3.0``
#: to ``>=3.10``), so every TensorFlow is tested with it, as ``pip install 'tflms[cpu]'`` installs it.
SUPPORTED: dict[tuple[int, int], tuple[tuple[int, int], ...]] = {
    (2, 16): ((3, 15),),
    (2, 17): ((3, 15),),
    (2, 18): ((3, 15),),
    (2, 19): ((3, 15),),
    (2, 20): ((3, 15),),
    (2, 21): ((3, 15),),
}

#: The distributions that install the ``tensorflow`` package, tried in this order when it is not imported yet
#: (a user has one of them; ``tensorflow`` also stands for ``tensorflow[and-cuda]``).
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tensorflow-macos",
                            "tensorflow-aarch64", "tensorflow-rocm", "tf-nightly", "tf-nightly-cpu")


def _minor(version: str) -> tuple[int, int] | None:
    """``(major, minor)`` of a version string such as ``2.16.2`` or ``2.22.0.dev20260101``; ``None`` if unreadable."""
    found = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else None


def _span(minors) -> str:
    minors = sorted(minors)
    first, last = minors[0], minors[-1]
    return f"{first[0]}.{first[1]}" if first == last else f"{first[0]}.{first[1]} to {last[0]}.{last[1]}"


def supported_range() -> str:
    """The supported versions in words, e.g. ``TensorFlow 2.16 to 2.21 with Keras 3.15``."""
    kerases = {k for ks in SUPPORTED.values() for k in ks}
    if all(set(ks) == kerases for ks in SUPPORTED.values()):
        return f"TensorFlow {_span(SUPPORTED)} with Keras {_span(kerases)}"
    return ", ".join(f"TensorFlow {t[0]}.{t[1]} with Keras {_span(ks)}" for t, ks in sorted(SUPPORTED.items()))


def install_hint() -> str:
    """The ``pip install`` requirements of the supported range (what ``tflms[cpu]`` declares)."""
    tfs = sorted(SUPPORTED)
    kerases = sorted({k for ks in SUPPORTED.values() for k in ks})
    return (f"'tensorflow-cpu>={tfs[0][0]}.{tfs[0][1]},<{tfs[-1][0]}.{tfs[-1][1] + 1}' "
            f"'keras>={kerases[0][0]}.{kerases[0][1]},<{kerases[-1][0]}.{kerases[-1][1] + 1}'")


def check(tensorflow: str | None, keras: str | None) -> None:
    """Raise :class:`UnsupportedVersionError` unless this TensorFlow and Keras are a supported pair.

    ``tensorflow`` / ``keras`` are version strings (``"2.16.2"``), or ``None`` where the
    package is not installed: tflms imports without TensorFlow (its pure-Python parts
    need none), and a missing Keras is not judged. The error names the versions found,
    the supported range and the command that installs it.
    """
    if tensorflow is None:
        return
    tf_minor = _minor(tensorflow)
    keras_minor = _minor(keras) if keras is not None else None
    kerases = SUPPORTED.get(tf_minor, ()) if tf_minor else ()
    if tf_minor in SUPPORTED and (keras is None or keras_minor in kerases):
        return
    found = f"TensorFlow {tensorflow}" + (f" with Keras {keras}" if keras is not None else "")
    if tf_minor not in SUPPORTED:
        why = f"TensorFlow {tensorflow} is not one of them"
    else:
        why = f"TensorFlow {tf_minor[0]}.{tf_minor[1]} is tested with Keras {_span(kerases)} only"
    raise UnsupportedVersionError(
        f"tflms supports {supported_range()}, and found {found}: {why}. tflms reads TensorFlow and Keras internals "
        f"that change between releases, so it runs only on the pairs CI tests. Install a supported pair: "
        f"pip install {install_hint()} (or pip install 'tflms[cpu]' / 'tflms[gpu]').")


def _imported_or_installed(module: str, distributions: tuple[str, ...]) -> str | None:
    """The version of ``module`` as imported (if it is), else of the first of ``distributions`` installed."""
    imported = sys.modules.get(module)
    version = getattr(imported, "__version__", None)
    if isinstance(version, str):
        return version
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed() -> tuple[str | None, str | None]:
    """``(TensorFlow version, Keras version)`` of this environment, ``None`` for a package not installed."""
    return (_imported_or_installed("tensorflow", TENSORFLOW_DISTRIBUTIONS),
            _imported_or_installed("keras", ("keras", "keras-nightly")))


def check_installed() -> None:
    """:func:`check` on this environment's TensorFlow and Keras (run once, when ``tflms`` is imported)."""
    check(*installed())
