"""Private TensorFlow/Keras APIs live behind tflms/_compat, and fail with the versions tflms is tested with."""

from __future__ import annotations

import ast
import pathlib

import pytest

import tflms
from tflms._compat import tf as compat
from tflms.errors import TflmsError, UnsupportedVersionError

ROOT = pathlib.Path(tflms.__file__).parent
PRIVATE_PREFIXES = ("tensorflow.python", "tensorflow.core", "keras.src")


def private_imports() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.parent.name == "_compat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            found.extend(f"{path.relative_to(ROOT.parent)}:{node.lineno}: {n}" for n in names
                         if n.startswith(PRIVATE_PREFIXES))
    return found


def test_private_modules_are_imported_only_in_compat():
    # tensorflow.core holds the protos (GraphDef, FunctionDef, AttrValue): they are TensorFlow's file formats,
    # stable across versions, and FunctionDef has no public alias; they are allowed where they are used.
    problems = [p for p in private_imports() if "tensorflow.core." not in p]
    assert problems == [], "import these through tflms._compat:\n" + "\n".join(problems)


def test_a_missing_internal_names_itself_and_the_tested_versions():
    with pytest.raises(UnsupportedVersionError, match=r"tensorflow\.python\.no_such_module.*tested with TensorFlow "
                                                      r"2\.16 to 2\.21 with Keras 3\.15") as err:
        compat.private("tensorflow.python.no_such_module")
    assert isinstance(err.value, TflmsError) and isinstance(err.value, ImportError)
    with pytest.raises(UnsupportedVersionError, match="op_def_registry.no_such_attr"):
        compat.private("tensorflow.python.framework.op_def_registry", "no_such_attr")


def test_accessors_reach_what_tflms_uses():
    assert compat.op_def("_FusedConv2D") is not None  # internal ops have OpDefs too
    assert compat.op_def("NoSuchOp") is None
    fd = compat.function_deserialization()
    assert hasattr(fd, "RestoredFunction")
    cluster, item, optimizer = compat.grappler()
    assert hasattr(cluster, "Cluster") and hasattr(item, "Item") and hasattr(optimizer, "OptimizeGraph")


def test_grappler_gets_each_devices_memory_limit_as_at_instantiation():
    """Instantiation's VirtualCluster gives grappler each device's memory_limit; the pre-pass must give the same
    (the memory optimizer's AddN accumulators depend on it), and TensorFlow reports it for this CPU."""
    from tensorflow.python.client import device_lib

    from tflms._compat import grappler
    reported = {d.memory_limit for d in device_lib.list_local_devices() if d.device_type == "CPU"}
    given = {d.properties.memory_size for d in grappler._named_devices() if d.properties.type == "CPU"}
    assert reported == given == {grappler.CPU_DEVICE_MEMORY_LIMIT} == {256 << 20}


def test_grappler_gets_the_cpu_as_tensorflow_describes_it():
    """Grappler's cost model prices a CPU at cores x frequency, and TensorFlow's frequency is half the bogomips
    of /proc/cpuinfo (CpuUtils), not its 'cpu MHz' line, which tflms read before issue 30; the memory optimizer's
    accumulators follow the schedule that cost model predicts. Checked against /proc/cpuinfo where it has them."""
    import os
    import pathlib

    from tflms._compat import grappler
    cpus = [d.properties for d in grappler._named_devices() if d.properties.type == "CPU"]
    assert cpus
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    fields = {}
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    if "bogomips" not in fields or "vendor_id" not in fields:
        pytest.skip("no x86 /proc/cpuinfo here to check TensorFlow's CPU description against")
    for props in cpus:
        assert abs(props.frequency - float(fields["bogomips"]) / 2) <= 1, (props.frequency, fields["bogomips"])
        assert props.num_cores == len(os.sched_getaffinity(0))
        assert props.vendor == fields["vendor_id"]
        assert "cpu_instruction_set" in props.environment  # all of GetLocalCPUInfo, not only what tflms knew of
        assert props.memory_size == grappler.CPU_DEVICE_MEMORY_LIMIT
