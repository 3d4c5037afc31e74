"""The package's layer order: every tflms module imports only modules of its own layer or below.

The layers, bottom to top (docs/design.md, "Layout"): a module may import a module of a lower
layer or of its own layer, never one above. Lazy imports inside functions count too: an upward
import is a dependency whatever its position. A new module must be given a layer here.
"""

from __future__ import annotations

import ast
import re
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
    ("decisions", ("tflms.compress", "tflms.tune", "tflms.budget")),
    ("measurement", ("tflms.measure", "tflms.baselines")),
    ("pipeline", ("tflms.pipeline", "tflms.report", "tflms.reportplot")),
    ("integrations", ("tflms.integrations", "tflms.keras")),
    ("front", ("tflms.cli", "tflms.demo", "tflms.testing", "tflms.models", "tflms.__main__", "tflms")),
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


TOOLS = ROOT.parent / "tools"
#: Calls that load code from a path or a name given at run time.
LOADERS = {"spec_from_file_location", "run_path", "import_module", "exec_module", "__import__"}


def example_imports(path: pathlib.Path) -> list[str]:
    """Places where a tool imports an example: ``import examples...`` or a loader call naming examples/."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "examples":
            found.append(f"{path.name}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found.extend(f"{path.name}:{node.lineno}: import {a.name}" for a in node.names
                         if a.name.split(".")[0] == "examples")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            mentions = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and "examples" in n.value
                           for n in ast.walk(node))
            if name in LOADERS and mentions:
                found.append(f"{path.name}:{node.lineno}: {name}(... examples ...)")
    return found


def test_tools_do_not_import_examples():
    """Code shared by a tool and an example lives in the package (e.g. tflms.models), not in examples/."""
    scripts = sorted(TOOLS.rglob("*.py"))
    assert scripts, f"no tools found under {TOOLS}"
    problems = [place for path in scripts for place in example_imports(path)]
    assert not problems, "tools import examples:\n" + "\n".join(problems)


def test_the_tools_check_sees_an_example_import(tmp_path):
    """A control: the importlib pattern tools/bench.py used to load examples/unet3d.py is reported."""
    bad = tmp_path / "tool.py"
    bad.write_text('import importlib.util\nREPO = None\n'
                   'spec = importlib.util.spec_from_file_location("m", REPO / "examples" / "unet3d.py")\n'
                   'from examples.unet3d import build_unet3d\n')
    assert sorted(p.split(":")[1] for p in example_imports(bad)) == ["3", "4"]


def test_op_type_sets_live_in_one_module():
    """Every module-level set of op-type names is defined in tflms/ir/op_types.py (issue 13)."""
    problems = []
    for name, path in modules().items():
        if name == "tflms.ir.op_types":
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            call = node.value
            if getattr(call.func, "id", None) != "frozenset" or not call.args:
                continue
            names = [e.value for e in getattr(call.args[0], "elts", []) if isinstance(e, ast.Constant)]
            # op types are CamelCase TensorFlow names; dtype sets and option names are lower case
            if names and all(isinstance(n, str) and re.match(r"_?[A-Z]", n) for n in names):
                problems.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert problems == [], "move these op-type sets to tflms/ir/op_types.py: " + ", ".join(problems)
