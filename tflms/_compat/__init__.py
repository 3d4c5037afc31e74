"""Every private TensorFlow API tflms calls, version-checked, failing with one clear message."""
