"""Private TensorFlow and Keras APIs, each behind one accessor that fails with the versions tflms supports."""
