"""TensorFlow internals tflms relies on, each behind one accessor.

TensorFlow has no public API for these; each accessor imports what it needs when it is first
called and, if this TensorFlow lacks it, raises :class:`~tflms.errors.UnsupportedVersionError`
naming the internal, the installed version and the versions tflms is tested with. Public
equivalents are used wherever they exist (``tf.types.experimental.ConcreteFunction``,
``tf.nest``, ``tf.compat.v1.GraphDef``), so everything here is what has none.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

from tflms._compat.versions import supported_range
from tflms.errors import UnsupportedVersionError

#: The versions CI runs the suite on (:data:`tflms._compat.versions.SUPPORTED`; pyproject.toml declares the same).
TESTED = supported_range()


def private(module: str, attr: str | None = None) -> Any:
    """``module`` (or its attribute ``attr``), or an error naming the internal and the tested versions."""
    try:
        found = importlib.import_module(module)
        return getattr(found, attr) if attr else found
    except (ImportError, AttributeError) as err:
        what = f"{module}.{attr}" if attr else module
        raise UnsupportedVersionError(
            f"tflms uses TensorFlow's internal {what}, which this installation lacks ({_versions()}); tflms is "
            f"tested with {TESTED}: install those (pip install 'tflms[cpu]' or 'tflms[gpu]')") from err


def _versions() -> str:
    try:
        import tensorflow as tf
        return f"TensorFlow {tf.__version__}"
    except ImportError:  # pragma: no cover - tflms needs TensorFlow for every caller of this module
        return "no TensorFlow"


def op_def(op_type: str) -> Any:
    """The registered ``OpDef`` of ``op_type`` (internal ops such as ``_FusedConv2D`` included), or ``None``."""
    return private("tensorflow.python.framework.op_def_registry").get(op_type)


def onednn_enabled() -> bool:
    """Whether TensorFlow runs oneDNN's CPU kernels and graph pass (x86 builds by default; ``TF_ENABLE_ONEDNN_OPTS=0``
    turns them off)."""
    return bool(private("tensorflow.python.util._pywrap_util_port", "IsMklEnabled")())


def eager_context() -> Any:
    """TensorFlow's eager context (function registration, run metadata)."""
    return private("tensorflow.python.eager.context").context()


@contextlib.contextmanager
def recorded_function_graphs() -> Iterator[list]:
    """The function graphs TensorFlow optimizes and runs inside the block: run metadata's ``FunctionGraphs``
    entries (pre- and post-optimization graphs), in a list filled when the block ends. A function reports its
    graphs when it is instantiated (its first call), not on later calls."""
    ctx = eager_context()  # (run metadata has no public API in TF 2.21)
    graphs: list = []
    ctx.enable_run_metadata()
    ctx.export_run_metadata()  # drop what earlier code left behind
    try:
        yield graphs
        graphs.extend(ctx.export_run_metadata().function_graphs)
    finally:
        ctx.disable_run_metadata()


def parse_saved_model(path: str) -> Any:
    """The ``SavedModel`` proto of the directory ``path`` (read without loading the model)."""
    return private("tensorflow.python.saved_model.loader_impl", "parse_saved_model")(path)


def trackable_children(obj: Any) -> dict[str, Any]:
    """The named children of a trackable object, as the SavedModel's object graph names them."""
    try:
        return obj._trackable_children()  # noqa: SLF001 - the object graph's own names; no public equivalent
    except AttributeError as err:
        raise UnsupportedVersionError(f"{type(obj).__name__} has no _trackable_children ({_versions()}); tflms is "
                                      f"tested with {TESTED}") from err


def function_deserialization() -> Any:
    """The module that rebuilds restored ``tf.function`` s (``RestoredFunction`` and its call dispatch)."""
    fd = private("tensorflow.python.saved_model.function_deserialization")
    for name in ("RestoredFunction", "_concrete_function_callable_with", "_call_concrete_function"):
        if not hasattr(fd, name):
            private("tensorflow.python.saved_model.function_deserialization", name)  # raises, naming it
    return fd


def grappler() -> tuple[Any, Any, Any]:
    """TensorFlow's grappler Python bindings: ``(cluster, item, tf_optimizer)`` modules."""
    return (private("tensorflow.python.grappler.cluster"), private("tensorflow.python.grappler.item"),
            private("tensorflow.python.grappler.tf_optimizer"))


def function_def_to_graph(function_def: Any, input_shapes: Any = None) -> Any:
    """A ``FuncGraph`` rebuilt from a ``FunctionDef``."""
    return private("tensorflow.python.framework.function_def_to_graph", "function_def_to_graph")(
        function_def, input_shapes=input_shapes)


def func_graph_class() -> Any:
    """``FuncGraph``: the graph a ``ConcreteFunction`` is built from."""
    return private("tensorflow.python.framework.func_graph", "FuncGraph")


def concrete_function_from_func_graph(func_graph: Any, function_type: Any, attrs: Any) -> Any:
    """``ConcreteFunction.from_func_graph`` (the public type has no constructor)."""
    cls = private("tensorflow.python.eager.polymorphic_function.concrete_function", "ConcreteFunction")
    return cls.from_func_graph(func_graph, function_type, attrs=attrs)


def replace_function_def(concrete: Any, function_def: Any) -> None:
    """Make ``concrete`` run ``function_def`` (same name and signature) instead of the one it was built with.

    Only before its first call: the runtime instantiates a function's registered definition then. The
    ``ConcreteFunction``'s cached copy is dropped so that ``function_def`` reads the new one.
    """
    atomic = concrete._inference_function  # noqa: SLF001 - the function a call runs
    ctx = eager_context()
    name = function_def.signature.name
    if ctx.has_function(name):
        ctx.remove_function(name)
    ctx.add_function_def(function_def)
    if hasattr(atomic, "_cached_definition"):
        atomic._cached_definition = None  # noqa: SLF001


def handle_data_util() -> Any:
    """Copying a resource tensor's handle data (variable shapes and dtypes) between graphs."""
    return private("tensorflow.python.ops.handle_data_util")


def unliftable_error() -> type:
    """The error ``tf.function`` raises for variables it cannot initialize outside the function."""
    return private("tensorflow.python.ops.op_selector", "UnliftableError")


def default_strategy() -> Any:
    """The default (no-op) distribution strategy object."""
    return private("tensorflow.python.distribute.distribute_lib", "_get_default_strategy")()


def local_device_protos() -> list[Any]:
    """Every local device's ``DeviceAttributes`` (memory limit included)."""
    return private("tensorflow.python.client.device_lib", "list_local_devices")()


def keras_print_msg() -> Any:
    """Keras's ``io_utils.print_msg`` (follows Keras's interactive-logging switch)."""
    try:
        return importlib.import_module("keras.src.utils.io_utils").print_msg
    except (ImportError, AttributeError) as err:
        raise UnsupportedVersionError(f"tflms uses Keras's internal keras.src.utils.io_utils.print_msg, which this "
                                      f"Keras lacks; tflms is tested with {TESTED}") from err


def xplane_pb2() -> Any:
    """The ``XSpace`` protocol buffers TensorFlow's profiler writes (``*.xplane.pb``)."""
    return private("tensorflow.tsl.profiler.protobuf.xplane_pb2")


def closure_value(function: Any, name: str) -> Any:
    """The value ``function``'s closure holds under ``name`` (a trainer's step inside its train function), or
    ``None``: the Keras flavours keep their step functions there and have no public accessor for them."""
    code, closure = function.__code__, function.__closure__ or ()
    try:
        return dict(zip(code.co_freevars, closure))[name].cell_contents
    except (KeyError, ValueError):  # not in the closure, or an empty cell
        return None


_XLA_KERNELS: dict[str, frozenset[str]] = {}


def xla_kernel_types(jit_device: str) -> frozenset[str]:
    """The op types XLA can compile for ``jit_device`` (``"XLA_CPU_JIT"``, ``"XLA_GPU_JIT"``): those with a kernel
    registered for it (empty when this TensorFlow has no such device).

    TensorFlow registers XLA's kernels lazily, at the first compilation (``XlaOpRegistry::RegisterCompilationKernels``
    has no Python binding), so where none is registered yet one tiny function is compiled on the CPU first.
    """
    if jit_device not in _XLA_KERNELS:
        kernels = private("tensorflow.python.framework.kernels", "get_all_registered_kernels")

        def registered() -> frozenset[str]:
            return frozenset(k.op for k in kernels().kernel if k.device_type == jit_device)

        found = registered()
        if not found:
            import tensorflow as tf
            with tf.device("/CPU:0"):
                tf.function(lambda x: x + 1, jit_compile=True)(tf.constant(0))
            found = registered()
        _XLA_KERNELS[jit_device] = found
    return _XLA_KERNELS[jit_device]
