"""The package's layer order: every tflms module imports only modules of its own layer or below.

The layers, bottom to top (docs/design.md, "Layout"): a module may import a module of a lower
layer or of its own layer, never one above. Lazy imports inside functions count too: an upward
import is a dependency whatever its position. A new module must be given a layer here.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import tflms

#: (layer, module prefixes), bottom first. The longest matching prefix decides a module's layer.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves", ("tflms.errors", "tflms.units", "tflms.devices", "tflms.profiles", "tflms._compat", "tflms.atomicfs",
                "tflms.interrupts", "tflms.faults")),
    ("config", ("tflms.config",)),
    ("ir", ("tflms.ir",)),
    ("analysis", ("tflms.analysis",)),
    ("simulation", ("tflms.sim", "tflms.memplan", "tflms.schedule")),
    ("policies", ("tflms.policies",)),
    ("passes", ("tflms.passes", "tflms.compress.codecs", "tflms.compress.rewrite", "tflms.compress.profiling")),
    ("decisions", ("tflms.compress", "tflms.tune")),
    ("measurement", ("tflms.measure", "tflms.baselines")),
    ("pipeline", ("tflms.pipeline", "tflms.report")),
    ("integrations", ("tflms.integrations", "tflms.keras")),
    ("front", ("tflms.cli", "tflms.demo", "tflms.testing", "tflms.__main__", "tflms")),
)

ROOT = pathlib.Path(tflms.__file__).parent


def layer_of(module: str) -> int:
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        raise AssertionError(f"module {module} has no layer: add it to LAYERS in {__file__}")
    return best


def modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "tflms":  # from tflms import interrupts: the submodules named
                found.extend((node.lineno, f"tflms.{a.name}") for a in node.names)
            elif node.module.split(".")[0] == "tflms":
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "tflms")
    return found


def upward_imports() -> list[str]:
    problems = []
    for name, path in modules().items():
        if name == "tflms":  # the package's front door re-exports the public API
            continue
        mine = layer_of(name)
        for lineno, target in imports_of(path):
            theirs = layer_of(target)
            if theirs > mine:
                problems.append(f"{path.relative_to(ROOT.parent)}:{lineno}: {name} ({LAYERS[mine][0]}) imports "
                                f"{target} ({LAYERS[theirs][0]})")
    return problems


def test_every_module_has_a_layer():
    for name in modules():
        layer_of(name)


def test_no_module_imports_a_higher_layer():
    problems = upward_imports()
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """A control: an IR module importing the pipeline is reported."""
    fake = tmp_path / "tflms" / "ir"
    fake.mkdir(parents=True)
    (tmp_path / "tflms" / "__init__.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "bad.py").write_text("def f():\n    from tflms.pipeline import rewrite_step\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path / "tflms")
    problems = upward_imports()
    assert len(problems) == 1 and "tflms.ir.bad (ir) imports tflms.pipeline (pipeline)" in problems[0]


@pytest.mark.parametrize("module", ["tflms.errors", "tflms.units", "tflms.devices", "tflms.profiles"])
def test_leaves_import_no_tensorflow_at_import_time(module):
    import subprocess
    import sys
    code = f"import sys, {module}; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
