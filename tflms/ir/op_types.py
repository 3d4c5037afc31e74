"""Every set of TensorFlow op types tflms knows about, in one place.

Each set says what tflms assumes about those ops; the modules that act on the assumption import it from here.
"""

#: Op types that call another function (opaque to tflms: their bodies are not rewritten).
CALL_OP_TYPES = frozenset({"StatefulPartitionedCall", "PartitionedCall"})

# ---------------------------------------- Gradient and update ops (the categorized topological ordering)
#: Op types that exist only to compute gradients.
GRADIENT_OP_TYPES = frozenset({
    "BiasAddGrad", "BiasAddGradV1", "BroadcastGradientArgs",
    "ReluGrad", "Relu6Grad", "EluGrad", "SeluGrad", "LeakyReluGrad",
    "SigmoidGrad", "TanhGrad", "SoftplusGrad", "SoftsignGrad", "RsqrtGrad", "SqrtGrad", "ReciprocalGrad",
    "InvGrad", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv2DBackpropInputV2",
    "Conv2DBackpropFilterV2", "Conv3DBackpropInput", "Conv3DBackpropFilter", "Conv3DBackpropInputV2",
    "Conv3DBackpropFilterV2", "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter",
    "FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3", "MaxPoolGrad", "MaxPoolGradV2",
    "MaxPoolGradGrad", "MaxPool3DGrad", "AvgPoolGrad", "AvgPool3DGrad", "LRNGrad", "ResizeBilinearGrad",
    "ResizeNearestNeighborGrad", "ResizeBicubicGrad", "SoftmaxGrad", "LogSoftmaxGrad",
    "_FusedBatchNormGradEx", "GeluGrad",
})

#: Lowered conditionals (what grappler makes of an ``If``): acyclic, so tflms reads them, but an op between a
#: ``Switch`` and its ``Merge`` may be dead (its branch not taken), and a dead op kills what it triggers.
CONDITIONAL_TYPES = frozenset({"Switch", "Merge", "RefSwitch", "RefMerge"})
#: Lowered loops (what grappler makes of a ``While``): frames and back edges, which tflms does not model.
LOOP_TYPES = frozenset({"Enter", "Exit", "NextIteration", "LoopCond", "RefEnter", "RefExit", "RefNextIteration"})
#: Op types of TF1 control flow (loops form cycles; frames are not modelled).
TF1_CONTROL_FLOW_TYPES = frozenset({"Switch", "Merge", "Enter", "Exit", "NextIteration", "RefSwitch",
                                    "RefMerge", "RefEnter", "RefExit", "RefNextIteration", "LoopCond"})

# ---------------------------------------- Memory behaviour (the simulator)
#: Ops whose output is a view of input 0 on the same device (of :data:`MULTI_ALIAS_OPS`: output k of input k).
ALIAS_OPS = frozenset({"Identity", "Reshape", "Squeeze", "ExpandDims", "StopGradient", "Snapshot",
                       "PreventGradient", "EnsureShape", "CheckNumerics", "IdentityN", "XlaOptimizationBarrier"})
#: Reductions that hand back their input's buffer when they reduce nothing (TensorFlow's ``ReductionOp``: a
#: trivial reduction, over no axis or only axes of size 1, is ``out.CopyFrom(data, shape)``, a shared buffer, for
#: reducers whose scalar identity holds). A broadcasting ``Add``'s gradient is such a ``Sum`` over axes that
#: ``BroadcastGradientArgs`` computes at run time. Known by sizes: output bytes equal to the input's.
IDENTITY_REDUCTION_OPS = frozenset({"Sum", "Prod", "Max", "Min", "All", "Any"})
#: Copy ops that move a tensor between devices when their input lives elsewhere.
COPY_OPS = frozenset({"Identity", "DeepCopy", "Snapshot"})
#: Element-wise ops whose output may reuse a same-sized input that dies with them (TensorFlow's
#: cwise kernels call ``forward_input_or_allocate_output`` on every same-shaped input; ``Cast``
#: only aliases a cast to the same dtype, so the dtype check leaves it allocating otherwise).
FORWARDING_OPS = frozenset({
    "Relu", "Relu6", "Elu", "Selu", "Tanh", "Sigmoid", "Neg", "Abs", "Exp", "Log", "Sqrt", "Rsqrt", "Square",
    "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "BiasAdd", "ReluGrad", "Relu6Grad",
    "TanhGrad", "SigmoidGrad", "AddN", "Cast", "SquaredDifference", "DivNoNan", "LeakyRelu", "LeakyReluGrad",
    "RsqrtGrad", "SqrtGrad", "ReciprocalGrad", "Reciprocal", "Inv", "EluGrad", "SeluGrad", "Softplus",
    "SoftplusGrad", "Softsign", "SoftsignGrad", "Log1p", "Expm1", "Sign", "Floor", "Ceil", "Round", "Rint",
    "Pow", "Div", "FloorDiv", "FloorMod", "Erf", "Erfc", "MulNoNan", "Xlogy", "Xdivy", "ClipByValue",
})
#: The :data:`ALIAS_OPS` with several outputs, output k a view of input k.
MULTI_ALIAS_OPS = frozenset({"IdentityN", "XlaOptimizationBarrier"})
#: Ops whose outputs are resident (variables) rather than step activations.
VARIABLE_READ_OPS = frozenset({"ReadVariableOp", "VarHandleOp", "ResourceGather"})
SOURCE_OPS = frozenset({"Placeholder", "_Arg"})

# ---------------------------------------- Cost (the cost model)
#: Ops that cost nothing on the accelerator (metadata or aliasing).
FREE_OPS = frozenset({"Const", "Placeholder", "_Arg", "_Retval", "NoOp", "Shape", "ShapeN", "Size", "Rank",
                      "ReadVariableOp", "VarHandleOp", "Identity", "Reshape", "Squeeze", "ExpandDims",
                      "StopGradient", "Snapshot", "PreventGradient", "BroadcastGradientArgs",
                      "XlaOptimizationBarrier", "IdentityN"})
#: Contractions the cost model prices at the math mode of their dtype (``HardwareProfile.math_mode``): the
#: ops cuBLAS and cuDNN run on tensor cores, TF32 included (``tf.config.experimental.enable_tensor_float_32_execution``
#: covers matrix products and convolutions), and grappler's fusions of them. Depthwise convolutions are
#: not among them: cuDNN runs them on CUDA cores, memory-bound; they stay at ``peak_flops``.
CONTRACTION_OPS = frozenset({
    "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum", "Conv2D", "Conv3D",
    "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2",
    "_FusedConv2D", "_FusedConv3D", "_FusedMatMul", "_FusedBatchMatMulV2"})

# ---------------------------------------- Fusion (the simulator's graph and xla clocks, tflms.sim.fusion)
#: Element-wise ops: every input is data, none an argument XLA needs at compile time (a shape, an axis), so any of
#: them may read a tensor through a barrier (:func:`tflms.ir.xla_gates.gate_role`).
XLA_ELEMENTWISE = FORWARDING_OPS | frozenset({
    "Cast", "Select", "SelectV2", "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "LogicalAnd",
    "LogicalOr", "LogicalNot", "IsFinite", "IsNan", "Sin", "Cos", "Tan", "Atan2", "Gelu", "ZerosLike", "OnesLike",
    "Identity", "StopGradient",
    # tf2xla's other element-wise unary kernels (tensorflow/compiler/tf2xla/kernels/unary_ops.cc, XLAJIT_MAKE_UNARY:
    # each an expression of XLA element-wise ops). Erfc is Keras 3's exact GELU on TensorFlow (tf.nn.gelu:
    # 0.5 * x * erfc(-x / sqrt(2))), in FORWARDING_OPS above (TensorFlow's UnaryOp, cwise_op_erfc.cc).
    "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Cosh", "Sinh", "IsInf", "Invert", "Erfinv", "Ndtri",
    "Lgamma", "Digamma", "Real", "Imag", "Conj", "ComplexAbs", "Angle"})
#: Stateless random numbers (Keras 3's dropout on TensorFlow: ``tf.random.stateless_uniform``). tf2xla lowers them
#: for the GPU and CPU JIT devices to an ``RngBitGenerator`` with ``RNG_PHILOX`` and element-wise conversions
#: (tensorflow/compiler/tf2xla/kernels/stateless_random_ops_v2.cc, ``GetBitGeneratorForDevice``); XLA:GPU expands
#: that into element-wise ops on an iota before it fuses (``RngBitGeneratorExpander(RNG_PHILOX)`` in
#: xla/service/gpu/gpu_compiler.cc, its call inlined), so the numbers are computed inside their reader's kernel.
XLA_STATELESS_RANDOM = frozenset({
    "StatelessRandomUniformV2", "StatelessRandomNormalV2", "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2",
    "StatelessRandomUniformFullIntV2", "StatelessRandomUniform", "StatelessRandomNormal", "StatelessTruncatedNormal"})
#: Ops XLA fuses into their consumers (element-wise, broadcasts, converts, data movement, stateless random numbers;
#: views are no kernels).
XLA_FUSIBLE = (XLA_ELEMENTWISE - {"Identity", "StopGradient"}) | XLA_STATELESS_RANDOM | frozenset({
    "BroadcastTo", "Fill", "Transpose", "Tile", "Pad", "PadV2", "MirrorPad", "Slice", "StridedSlice", "ConcatV2",
    "Pack", "ReverseV2", "OneHot", "GatherV2", "Range"})
#: Ops that take element-wise producers into their own kernel and whose output reaches memory.
XLA_REDUCTIONS = IDENTITY_REDUCTION_OPS | frozenset({
    "Mean", "BiasAddGrad", "ArgMax", "ArgMin", "Softmax", "LogSoftmax", "SparseSoftmaxCrossEntropyWithLogits",
    "SoftmaxCrossEntropyWithLogits", "L2Loss", "EuclideanNorm", "MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedBatchNormGrad", "FusedBatchNormGradV2",
    "FusedBatchNormGradV3"})
#: Variable updates: the new value's fusion writes it into the variable's buffer.
XLA_ASSIGNS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"})
#: Ops XLA fuses an element-wise producer into (the rest, products and convolutions among them, read their
#: operands from memory): the fusible ones, reductions (input fusions) and variable updates.
XLA_TAKES_PRODUCERS = XLA_FUSIBLE | XLA_REDUCTIONS | XLA_ASSIGNS
#: What an XLA cluster does with the resource of each resource op (``tensorflow/compiler/tf2xla/
#: resource_operation_table.cc``; ops that call functions count as both, ``resource_operation_safety_analysis.cc``).
#: A cluster reads all its resources at its start and writes them at its end, so TensorFlow never puts in one cluster
#: a write and a read that a path orders after it (:func:`tflms.ir.xla_segments.resource_kind`).
XLA_RESOURCE_READS = frozenset({
    "ReadVariableOp", "ResourceGather", "VarIsInitializedOp", "VariableShape", "CollectiveReduceV2", "StackCloseV2",
    "TensorArrayConcatV3", "TensorArrayGatherV3", "TensorArrayGradV3", "TensorArrayCloseV3", "TensorArrayReadV3",
    "TensorArraySizeV3"})
XLA_RESOURCE_WRITES = frozenset({
    "AssignVariableOp", "StackV2", "TensorArrayV3", "TensorArrayScatterV3", "TensorArraySplitV3",
    "TensorArrayWriteV3"})
XLA_RESOURCE_MODIFIES = frozenset({
    "AssignAddVariableOp", "AssignSubVariableOp", "ResourceApplyAdaMax", "ResourceApplyAdadelta",
    "ResourceApplyAdagrad", "ResourceApplyAdagradV2", "ResourceApplyAdagradDA", "ResourceApplyAdam",
    "ResourceApplyAddSign", "ResourceApplyCenteredRMSProp", "ResourceApplyFtrl", "ResourceApplyFtrlV2",
    "ResourceApplyGradientDescent", "ResourceApplyMomentum", "ResourceApplyKerasMomentum", "ResourceApplyPowerSign",
    "ResourceApplyProximalAdagrad", "ResourceApplyProximalGradientDescent", "ResourceApplyRMSProp",
    "ResourceScatterAdd", "ResourceScatterDiv", "ResourceScatterMax", "ResourceScatterMin", "ResourceScatterMul",
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate", "ResourceScatterSub",
    "ResourceScatterUpdate", "ResourceStridedSliceAssign", "RngReadAndSkip", "RngSkip", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulUniform", "StatefulUniformFullInt", "StatefulUniformInt", "StackPopV2",
    "StackPushV2", "PartitionedCall", "StatefulPartitionedCall"})
#: Reductions XLA runs as kernels of their own (windows, batch-norm library expansions), never as siblings.
XLA_OWN_KERNEL_REDUCTIONS = frozenset({"MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "Softmax", "LogSoftmax"})

# ---------------------------------------- Swap rules (every policy)
#: Identity-like ops grappler removes (it reconnects their consumers to their input):
#: never swap their outputs (swap the input instead) and never use them as triggers.
IDENTITY_OPS = frozenset({"Identity", "IdentityN", "StopGradient", "Snapshot", "PreventGradient"})
#: producers whose outputs TF keeps on the host.
HOST_PRODUCERS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs", "TensorListLength"})

# ---------------------------------------- Layers (vDNN)
#: Convolutions: the layers ``vdnn_conv`` offloads.
CONV_TYPES = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "_FusedConv2D", "_FusedConv3D",
                        "_FusedDepthwiseConv2dNative"})
#: Compute-heavy forward ops: vDNN's layers (``vdnn_all``), and the layers whose backward ops trigger prefetches.
COMPUTE_HEAVY_TYPES = CONV_TYPES | frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                                              "_FusedMatMul", "Einsum"})
#: Consumers that read only a tensor's shape: they keep the resident tensor (they run as soon as it exists),
#: so a ``ShapeN`` of the gradient code does not pull a feature map back at the start of the backward pass.
METADATA_ONLY_TYPES = frozenset({"Shape", "ShapeN", "Size", "Rank"})

# ---------------------------------------- Execution order (tflms.schedule)
#: Ops that read only a tensor's metadata: grappler folds them to constants when shapes are static, and an
#: edge on them would prevent that.
METADATA_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "BroadcastGradientArgs"})
_ACTIVATIONS = frozenset({"Relu", "Relu6", "Elu", "LeakyRelu", "Tanh", "Sigmoid", "Gelu"})
_ADDS = frozenset({"Add", "AddV2", "AddN"})
_CONTRACTIONS = frozenset({"Conv2D", "Conv3D", "MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3",
                           "DepthwiseConv2dNative"})
#: Producer type -> consumer types that grappler may fuse or re-associate with it when the producer has no
#: control edges and feeds only that consumer: the remapper (a contraction with BiasAdd, Add, Mul, Cast or
#: an activation; BiasAdd or an add with an activation or add; FusedBatchNorm with Relu/Add; Sigmoid*x) and
#: the arithmetic optimizer (add trees into one AddN, Mul/Add chains re-associated to minimize broadcasts,
#: common factors of Muls hoisted out of an add). Both skip nodes with control fan-in or fan-out.
FUSABLE = {
    **{c: _ACTIVATIONS | _ADDS | {"BiasAdd", "Mul", "Cast"} for c in _CONTRACTIONS},
    "BiasAdd": _ACTIVATIONS | _ADDS,
    **{a: _ACTIVATIONS | _ADDS for a in _ADDS},
    "Mul": frozenset({"Mul"}),
    **{bn: frozenset({"Relu", "Add", "AddV2"}) for bn in ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")},
    "Sigmoid": frozenset({"Mul"}), "Tanh": frozenset({"Mul"}),
}
#: Ops that oneDNN's graph pass fuses with a sibling reading the same input (``Conv2DBackpropFilter`` with
#: ``BiasAddGrad`` into ``_MklConv2DBackpropFilterWithBias``) unless they carry control edges: never ordered
#: when such a sibling exists (:func:`tflms.schedule.edges.fusion_siblings`). Without one nothing can fuse: the
#: filter gradient of a convolution without bias (e.g. before a batch norm) is ordered like any other op.
FUSION_SENSITIVE_OPS = frozenset({"Conv2DBackpropFilter", "Conv3DBackpropFilterV2", "BiasAddGrad"})

#: Pairs oneDNN's CPU graph pass (``mkl_layout_pass.cc``, ``minfo_``) merges into one node after tflms, when both carry
#: the same control inputs (:mod:`tflms.ir.merges`): a filter gradient and the bias gradient of the same output
#: gradient, a ``Conv2D`` and its only ``BiasAdd``, a ``Pad`` and the ``VALID`` convolution it feeds.
ONEDNN_FILTER_BIAS_GRADS = ("Conv2DBackpropFilter", "BiasAddGrad")
ONEDNN_CONV_BIAS = ("Conv2D", "BiasAdd")
ONEDNN_PAD_CONVS = frozenset({"Conv2D", "_FusedConv2D"})

#: oneDNN's CPU graph pass (``mkl_layout_pass.cc``: ``MaxpoolGradRewrite``, ``LrnGradRewrite``, the workspace
#: table ``wsinfo_``) hands a forward op's workspace (the argmax of a max pool) to its gradient only when the
#: gradient reads the forward op's output *directly*: ``{(forward type, output): (gradient type, input)}``.
#: Read through a swap-in, ``MaxPoolGrad`` stays TensorFlow's Eigen kernel, which routes the gradient of tied
#: maxima to another element than oneDNN's (NASNetMobile trained differently, docs/design.md).
ONEDNN_WORKSPACE_EDGES = {("MaxPool", 0): ("MaxPoolGrad", 1), ("MaxPool3D", 0): ("MaxPool3DGrad", 1),
                          ("LRN", 0): ("LRNGrad", 2)}

# ---------------------------------------- Constants and Python callbacks
#: Ops whose outputs are constants (resident, like variables).
CONSTANT_OPS = frozenset({"Const", "HostConst"})
#: Ops that call back into Python: their code is not part of a SavedModel, so a loaded model cannot run them.
PYTHON_CALLBACK_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})

# ---------------------------------------- XLA clusters (tflms.passes.xla_clusters, issue 47)
#: Ops the clustering pass never marks for XLA whatever the kernel registry says: the function's arguments and
#: results, Python callbacks, and ops that create resources (a variable or a table is made once, by TensorFlow's
#: executor, not by a compiled cluster).
XLA_NEVER_TYPES = PYTHON_CALLBACK_OPS | frozenset({
    "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "VarHandleOp",
    "VariableV2", "Variable", "TemporaryVariable", "DestroyTemporaryVariable", "HashTableV2",
    "MutableHashTableV2", "MutableDenseHashTableV2", "AnonymousIteratorV3", "IteratorGetNext",
    "IteratorGetNextAsOptional"})
#: dtypes XLA does not compute with: a tensor of one of them keeps its producer and consumers out of clusters.
XLA_NEVER_DTYPES = frozenset({"string", "variant"})

# ---------------------------------------- What TensorFlow ran (tflms.testing.ran)
#: Op types that are plumbing, not the user's computation (arguments, results, constants, no-ops, iterator and
#: optional handling Keras's loop adds around the step, function calls).
PLUMBING_OP_TYPES = frozenset({
    "_Arg", "_Retval", "NoOp", "Const", "Identity", "IdentityN", "IteratorGetNext", "IteratorGetNextAsOptional",
    "OptionalHasValue", "OptionalGetValue", "OptionalNone", "OptionalFromValue", "StatefulPartitionedCall",
    "PartitionedCall", "_Send", "_Recv", "_HostSend", "_HostRecv"})


def trivial_reduction(data, out) -> bool:
    """Whether a reduction from ``data`` to ``out`` (``TensorInfo`` s) reduces nothing: same dtype and bytes."""
    return out.num_bytes is not None and out.num_bytes == data.num_bytes and out.dtype == data.dtype
