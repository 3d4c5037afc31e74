"""Rewrite the training functions of a TF2 SavedModel offline.

:func:`rewrite_saved_model` loads a SavedModel written by
``tf.saved_model.save`` (for example a ``tf.Module`` with a ``train``
``tf.function``), rewrites the traced graphs of the selected functions as
:func:`tflms.pipeline.rewrite_step` says, and saves a new SavedModel in which
the same attribute names hold the rewritten functions, running on the restored
variables. ``tf.saved_model.load(out_dir).train(x, y)`` then runs the swapping
graph. :func:`analyze_saved_model` shows the ordering, the swap report and the
simulated memory of each function without writing anything.

What is kept and what changes:

- Each selected ``tf.function`` keeps its name, its input signature (or lack of
  one) and every traced signature: each trace with a training step is rewritten,
  a trace without one (e.g. a ``training=False`` branch) is kept as it is.
  A ``ConcreteFunction`` attribute is replaced by its rewrite.
- Functions that are not selected, variables, assets and sub-objects are kept.
  A signature whose wrapper calls a rewritten trace is re-exported around the
  rewrite (same keys, inputs and outputs); the others are kept as they are.
- Without ``functions``, every function is tried and those with no training step
  (inference functions) are left alone; naming a function without a training
  step is an error.

Data safety: the input directory is never written (an output equal to, inside
or containing the input is refused). The new model is written to a hidden
directory next to the output (created first: an unwritable parent is refused
before any work), checked (every swap op is in the saved function, the
signatures did not change), flushed to disk, and moved into place in one
atomic step; on any failure or signal the hidden directory is removed and
nothing else is touched. Without ``replace`` the move never replaces anything:
an output that appeared meanwhile is left alone and the rewrite refused. With
``replace=True`` the output is checked again at the commit (only a SavedModel
directory, or an empty one, is ever replaced), the new model takes its
permission modes, and the two are exchanged atomically (Linux
``renameat2(RENAME_EXCHANGE)``; where that is missing, replacing is refused);
the old model is removed after. OUT_DIR is therefore absent, the old model or
the complete new one at every instant, also when the process is killed; the
hidden directories a killed run leaves name their process and are removed by
the next run once it is gone (see :mod:`tflms.atomicfs`). ``verify=True``
additionally loads both models, runs every rewritten trace once on example
inputs (executing the graph, side effects included) and checks that the
outputs and all variables are bitwise identical, before anything is moved.

Limits: a ``tf.function`` saved without an ``input_signature`` only has the
traces it had when saved (exactly like the loaded original: another input shape
is refused when called, it cannot be retraced). TF1 SavedModels (no object
graph) and remote paths (``gs://``) are refused. ``tf.saved_model.SaveOptions``
of the original save (e.g. function aliases) are not carried over.

Modules: ``read`` (the proto: functions, signatures; loading), ``rewrite``
(:func:`rewrite_saved_model`), ``write`` (OUT_DIR checks, saving, the atomic
commit), ``verify`` (:func:`verify_equivalence`), ``analyze``
(:func:`analyze_saved_model`).
"""

from tflms.errors import SavedModelError

from tflms.integrations.savedmodel.analyze import TraceAnalysis, analyze_saved_model
from tflms.integrations.savedmodel.read import (INTERNAL_SIGNATURE_KEYS, SAVED_MODEL_FILES, FunctionInfo,
                                                SavedModelInfo, check_input_dir, describe_trace, read_saved_model,
                                                select_functions)
from tflms.integrations.savedmodel.rewrite import (SavedModelRewrite, SkippedTrace, TraceRewrite,
                                                   rewrite_saved_model, unknown_size_hint)
from tflms.integrations.savedmodel.verify import (VERIFY_SEED, VERIFY_UNKNOWN_DIM, check_verifiable,
                                                  example_inputs, verify_equivalence)
from tflms.integrations.savedmodel.verify import _variables  # noqa: F401 - tests compare variables through it
from tflms.integrations.savedmodel.write import (CUSTOM_GRADIENTS_WARNING, OLD_INFIX, TEMP_INFIX,
                                                 check_output_dir)

__all__ = ["CUSTOM_GRADIENTS_WARNING", "INTERNAL_SIGNATURE_KEYS", "OLD_INFIX",
           "SAVED_MODEL_FILES", "TEMP_INFIX", "VERIFY_SEED", "VERIFY_UNKNOWN_DIM", "FunctionInfo", "SavedModelError",
           "SavedModelInfo", "SavedModelRewrite", "SkippedTrace", "TraceAnalysis", "TraceRewrite",
           "analyze_saved_model", "check_input_dir", "check_output_dir", "check_verifiable", "describe_trace",
           "example_inputs", "read_saved_model", "rewrite_saved_model", "select_functions", "unknown_size_hint",
           "verify_equivalence"]
