"""Entry points for TensorFlow users: tf.function wrapper (and more to come)."""
