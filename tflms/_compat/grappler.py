"""Private TensorFlow APIs for running grappler from Python (tested as :mod:`tflms._compat.versions` says).

- :func:`function_call_config`: the ``ConfigProto`` eager function calls pass to
  function instantiation (``context.function_call_options``), whose
  ``rewrite_options`` choose grappler's optimizers;
- :func:`run_grappler`: grappler's meta-optimizer on a ``GraphDef``
  (``tf_optimizer.OptimizeGraph`` on a ``MetaGraphDef`` whose ``train_op``
  collection lists the nodes to fetch), on a virtual cluster of this process's
  devices;
- :func:`resource_handle_shape`: the dtype and shape of a variable behind a
  resource placeholder (``handle_data_util``);
- :func:`mark_grappler_done`: make a ``ConcreteFunction`` run with grappler off
  (a thread-local ``FunctionCallOptions`` around its eager call).

Each raises :class:`~tflms.errors.UnsupportedVersionError` naming the TF
version tflms was tested with when the private API is not there.
"""

from __future__ import annotations

import contextlib
import functools
import logging

from tflms._compat.versions import supported_range
from tflms.errors import UnsupportedVersionError

logger = logging.getLogger(__name__)


def _unsupported(what: str, err: Exception) -> UnsupportedVersionError:
    import tensorflow as tf
    return UnsupportedVersionError(
        f"tflms needs TensorFlow's private {what} to keep training bitwise identical under grappler, and this "
        f"TensorFlow ({tf.__version__}) does not have it as tflms expects ({type(err).__name__}: {err}). tflms was "
        f"tested with {supported_range()}; install one of those")


def function_call_config():
    """The ``ConfigProto`` an eager call of a function passes to its instantiation (this thread)."""
    try:
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.eager import context
        serialized = context.context().function_call_options.config_proto_serialized
        return config_pb2.ConfigProto.FromString(serialized)
    except (ImportError, AttributeError) as err:
        raise _unsupported("eager function call options (context.function_call_options)", err) from err


def _full_device_name(name: str) -> str:
    return name if name.startswith("/job:") else "/job:localhost/replica:0/task:0" + name


def local_devices() -> list[str]:
    """Full names of this process's logical devices, in TensorFlow's order."""
    import tensorflow as tf
    return [_full_device_name(d.name) for d in tf.config.list_logical_devices()]


def default_device() -> str:
    """The device a function's unplaced ops go to: the first GPU, else the first CPU."""
    import tensorflow as tf
    gpus = tf.config.list_logical_devices("GPU")
    return _full_device_name((gpus or tf.config.list_logical_devices("CPU"))[0].name)


@functools.lru_cache(maxsize=1)
def _local_device_properties() -> dict[tuple[str, int], object]:
    """TensorFlow's own ``DeviceProperties`` of this machine's devices, ``{(type, index): properties}``.

    Function instantiation gives grappler a ``VirtualCluster`` whose devices are
    described by ``GetDeviceInfo`` (``grappler/clusters/utils.cc``): a CPU's
    vendor, model, cores, frequency, caches and instruction sets; a GPU's SMs,
    clock, bandwidth and compute capability. Grappler's cost model reads them (a
    CPU's FLOP/s are its cores times its frequency), and the memory optimizer's
    decision to turn an ``AddN`` into an accumulator follows the schedule that
    cost model predicts. So the pre-pass must give grappler the same figures, and
    only TensorFlow knows them exactly: its CPU frequency is half the
    ``bogomips`` of ``/proc/cpuinfo`` (``CpuUtils::GetCycleCounterFrequency``),
    not the ``cpu MHz`` line, which differs wherever the kernel reports the current
    clock (issue 30: an accumulator in tflms's step and none in the user's). A
    ``SingleMachine`` cluster (``Cluster()`` with no devices) lists them through the
    same ``GetDeviceInfo``. ``{}`` when it cannot be made (logged; the caller then
    describes the devices itself, and grappler may decide differently).
    """
    try:
        from tensorflow.python.grappler import cluster as gcluster
    except ImportError as err:
        raise _unsupported("grappler Python bindings (tensorflow.python.grappler)", err) from err
    try:
        local = gcluster.Cluster()
    except Exception as err:  # noqa: BLE001 - TensorFlow raises its own error types from the C++ side
        logger.warning("tflms: TensorFlow could not describe this machine's devices (%s: %s); grappler's cost model "
                       "may see other figures here than at function instantiation", type(err).__name__, err)
        return {}
    try:
        found = {}
        for named in local.ListDevices():
            kind, _, index = named.name.rpartition("/device:")[2].partition(":")
            found[(kind, int(index or 0))] = named.properties
        return found
    finally:
        local.Shutdown()


def _tf_properties(device_type: str, index: int):
    """A copy of TensorFlow's ``DeviceProperties`` of this device (a logical CPU: the CPU's), or ``None``."""
    from tensorflow.core.protobuf import device_properties_pb2
    local = _local_device_properties()
    found = local.get((device_type, index if device_type != "CPU" else 0))
    if found is None:
        return None
    props = device_properties_pb2.DeviceProperties()
    props.CopyFrom(found)
    return props


#: The ``memory_limit`` TensorFlow gives every CPU device (``ThreadPoolDevice`` in
#: ``threadpool_device_factory.cc``: ``Bytes(256 << 20)``), logical ones included.
CPU_DEVICE_MEMORY_LIMIT = 256 << 20


@functools.lru_cache(maxsize=1)
def _gpu_memory_limits() -> tuple[int, ...]:
    """``memory_limit`` in bytes of each logical GPU, in TensorFlow's order (what its allocator may use).

    A physical GPU split into logical ones (``tf.config.set_logical_device_configuration``)
    gives each its configured limit (MiB); otherwise the device's own limit, as
    ``device_lib`` reports it. Not checked on a GPU (there is none here): 0 (unknown)
    for a device it cannot find, which is what grappler got before.
    """
    import tensorflow as tf
    try:
        from tensorflow.python.client import device_lib
    except ImportError as err:
        raise _unsupported("device attributes (device_lib.list_local_devices)", err) from err
    reported = None
    limits = []
    for index, physical in enumerate(tf.config.list_physical_devices("GPU")):
        configured = tf.config.get_logical_device_configuration(physical)
        if configured:
            limits.extend(int(c.memory_limit or 0) << 20 for c in configured)
            continue
        if reported is None:
            reported = [int(d.memory_limit) for d in device_lib.list_local_devices() if d.device_type == "GPU"]
        limits.append(reported[index] if index < len(reported) else 0)
    return tuple(limits)


def _named_devices():
    """This process's logical devices with the properties function instantiation gives grappler.

    At instantiation grappler's cluster is a ``VirtualCluster`` over the runtime's
    devices (``virtual_cluster.cc``): each described as TensorFlow describes it
    (:func:`_local_device_properties`), with ``memory_size`` set to the device's
    ``memory_limit``. The memory optimizer reads both: its scheduling pass rewrites
    an ``AddN`` of more than two inputs into a ``TemporaryVariable`` accumulator when
    the peak it estimates on a schedule of the cost model's op times passes 80% of
    the memory. Left at 0 (unknown), that pass never runs here while it does in the
    user's own function (e.g. ResNet50 at 224x224, whose estimate passes 80% of a CPU
    device's 256 MiB); with another frequency it may run here and not there.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import device_properties_pb2
    devices = []
    for logical in tf.config.list_logical_devices():
        index = int(logical.name.rsplit(":", 1)[-1])
        props = _tf_properties(logical.device_type, index)
        if props is None:  # TensorFlow did not list it: the figures grappler's cost model needs least
            props = device_properties_pb2.DeviceProperties(type=logical.device_type)
            if logical.device_type == "GPU":  # the layout optimizer reads the compute capability
                physical = tf.config.list_physical_devices("GPU")
                if index < len(physical):
                    details = tf.config.experimental.get_device_details(physical[index])
                    capability = details.get("compute_capability")
                    if capability:
                        props.environment["architecture"] = f"{capability[0]}.{capability[1]}"
                    props.vendor = "NVIDIA"
        if logical.device_type == "CPU":
            props.memory_size = CPU_DEVICE_MEMORY_LIMIT
        if logical.device_type == "GPU":
            gpu_limits = _gpu_memory_limits()  # device_lib builds device objects: once per process
            props.memory_size = gpu_limits[index] if index < len(gpu_limits) else 0
        devices.append(device_properties_pb2.NamedDevice(name=_full_device_name(logical.name), properties=props))
    return devices


def run_grappler(graph_def, fetch_nodes, config):
    """Grappler's meta-optimizer (as ``config`` sets it up) on ``graph_def``; returns the optimized ``GraphDef``.

    ``fetch_nodes`` are node names grappler must keep and compute. The cluster
    is a virtual one made of this process's devices, as at function
    instantiation (grappler reads device types, e.g. for the remapper's CPU and
    GPU fusions and the layout optimizer).
    """
    try:
        from tensorflow.core.protobuf import meta_graph_pb2
        from tensorflow.python.grappler import cluster as gcluster
        from tensorflow.python.grappler import tf_optimizer
    except ImportError as err:
        raise _unsupported("grappler Python bindings (tensorflow.python.grappler)", err) from err
    meta_graph = meta_graph_pb2.MetaGraphDef()
    meta_graph.graph_def.CopyFrom(graph_def)
    meta_graph.collection_def["train_op"].node_list.value.extend(fetch_nodes)
    try:
        cluster = gcluster.Cluster(devices=_named_devices())
        return tf_optimizer.OptimizeGraph(config, meta_graph, verbose=False, cluster=cluster,
                                          strip_default_attributes=False)
    except (TypeError, AttributeError) as err:
        raise _unsupported("grappler Python bindings (tf_optimizer.OptimizeGraph)", err) from err


def resource_handle_shape(tensor):
    """``(dtypes, shapes)`` (enum ints, ``TensorShapeProto`` s) of the variable behind a resource tensor, or ``None``."""
    try:
        from tensorflow.python.ops import handle_data_util
    except ImportError as err:
        raise _unsupported("resource handle data (handle_data_util)", err) from err
    data = handle_data_util.get_resource_handle_data(tensor)
    if data is None or not data.is_set or not data.shape_and_type:
        return None
    return [s.dtype for s in data.shape_and_type], [s.shape for s in data.shape_and_type]


@contextlib.contextmanager
def grappler_disabled():
    """Eager function calls in this thread instantiate their functions with grappler off.

    TensorFlow instantiates a function once per distinct call ``config_proto``,
    so functions called here get their own instantiation; calls outside are
    unaffected.
    """
    try:
        from tensorflow.python.eager import context
        ctx = context.context()
        previous = ctx.function_call_options
        config = function_call_config()
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        options = context.FunctionCallOptions(executor_type=previous.executor_type, config_proto=config)
    except (ImportError, AttributeError) as err:
        raise _unsupported("eager function call options (context.FunctionCallOptions)", err) from err
    ctx.function_call_options = options
    try:
        yield
    finally:
        ctx.function_call_options = previous


@functools.lru_cache(maxsize=None)
def _grappler_done_class():
    try:
        from tensorflow.python.eager.polymorphic_function import concrete_function as cf_lib
    except ImportError as err:
        raise _unsupported("ConcreteFunction (polymorphic_function.concrete_function)", err) from err
    if not hasattr(cf_lib.ConcreteFunction, "_call_flat"):
        raise _unsupported("ConcreteFunction._call_flat", AttributeError("_call_flat"))

    class GrapplerDoneFunction(cf_lib.ConcreteFunction):
        """A ``ConcreteFunction`` whose graph grappler has already optimized: called with grappler off."""

        def _call_flat(self, *args, **kwargs):  # noqa: D401 - TF's private entry of every call
            with grappler_disabled():
                return super()._call_flat(*args, **kwargs)

    return GrapplerDoneFunction


def mark_grappler_done(concrete_function):
    """Make ``concrete_function`` run with grappler off when called eagerly (in place; returns it)."""
    concrete_function.__class__ = _grappler_done_class()
    return concrete_function


def is_grappler_done(concrete_function) -> bool:
    """Whether :func:`mark_grappler_done` was applied to ``concrete_function``."""
    return type(concrete_function) is _grappler_done_class()
