"""The shared kit for tests, tools, examples and the demo.

- :mod:`tflms.testing.graphs`: hand-built IR graphs (:class:`GraphBuilder`,
  :func:`mlp_training_graph`), no TensorFlow needed, :func:`serial_clock` to time them as before issue 46, and
  :func:`without_copies`, a rewritten graph with its swap copies taken out (the control of bitwise checks);
- :mod:`tflms.testing.steps`: :func:`make_train_step`, the one GradientTape
  training step;
- :mod:`tflms.testing.bitwise`: :func:`snapshot`, :func:`bitwise_diff`,
  :func:`assert_bitwise_equal`: byte-level comparison of weights and optimizer
  state (``tobytes()``, so ``-0.0`` differs from ``0.0`` and a NaN equals itself);
- :mod:`tflms.testing.models`: a small model zoo (mlp, cnn, residual, add tree,
  layer-norm + gelu, MultiHeadAttention block, BERT-style encoder), each built
  deterministically from a seed, and :func:`make_batches` for them;
- :mod:`tflms.testing.ran`: what TensorFlow really ran (run metadata): the
  post-optimization step graph, its op-type counts, whether swap ops survived.

TensorFlow and Keras are imported only when a function needs them.
"""

from tflms.testing.bitwise import (Difference, Snapshot, assert_bitwise_equal, bitwise_diff, differences,
                                   largest_relative_difference, snapshot)
from tflms.testing.graphs import (GraphBuilder, forward_backward_chain, mlp_training_graph, serial_clock,
                                  tensor_info, two_branch_graph, without_copies)
from tflms.testing.models import MODEL_BUILDERS, build_model, make_batches
from tflms.testing.ran import RanGraphs, op_type_counts, record_run_metadata
from tflms.testing.steps import make_train_step

__all__ = ["Difference", "GraphBuilder", "MODEL_BUILDERS", "RanGraphs", "Snapshot", "assert_bitwise_equal",
           "bitwise_diff", "build_model", "differences", "forward_backward_chain", "largest_relative_difference",
           "make_batches", "make_train_step", "mlp_training_graph", "op_type_counts", "record_run_metadata",
           "serial_clock", "snapshot", "tensor_info", "two_branch_graph", "without_copies"]
