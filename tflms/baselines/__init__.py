"""Alternatives to tflms's swapping, measured by the same simulator (see ``tools/bench.py``).

- :mod:`tflms.baselines.grappler_swap`: TensorFlow grappler's own memory optimizer
  (``RewriterConfig.SWAPPING_HEURISTICS``) on a virtual GPU with a profile's memory,
  its swaps read back into the IR.
- :mod:`tflms.baselines.recompute`: gradient checkpointing of a Keras functional
  model with ``tf.recompute_grad`` per segment.

Importing this package does not import TensorFlow.
"""
