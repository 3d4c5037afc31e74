"""Models shared by the examples, the tools and the tests, so that none of them imports another's file.

- :func:`build_unet3d`: the 3D U-Net (Cicek et al., 2016) the TFLMS paper scaled to
  larger image resolutions (``examples/unet3d.py`` trains it, ``tools/bench.py``
  traces it at many volumes), and :func:`unet3d_input_specs`, its input signature
  for a cube or a ``(D, H, W)`` volume.

Importing this module imports Keras.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from tflms.errors import ConfigError


def build_unet3d(*, channels: int = 4, classes: int = 4, base_filters: int = 32, depth: int = 4,
                 batch_norm: bool = True, name: str = "unet3d") -> keras.Model:
    """A 3D U-Net for inputs ``(batch, D, H, W, channels)``; D, H, W multiples of ``2 ** depth``.

    Level ``i`` (0 = full resolution) has ``base_filters * 2**i`` filters in its
    first convolution and twice that in its second (as in the original 3D U-Net);
    the bottom level sits below ``depth`` poolings.
    """
    if depth < 1 or base_filters < 1:
        raise ConfigError(f"build_unet3d: depth and base_filters must be >= 1, got {depth} and {base_filters}; "
                          "the defaults are depth=4, base_filters=32")

    def conv(x, filters, label):
        x = keras.layers.Conv3D(filters, 3, padding="same", use_bias=not batch_norm, name=f"{label}_conv")(x)
        if batch_norm:
            x = keras.layers.BatchNormalization(name=f"{label}_bn")(x)
        return keras.layers.ReLU(name=f"{label}_relu")(x)

    inputs = keras.Input((None, None, None, channels), name="volume")
    x, skips = inputs, []
    for level in range(depth):
        filters = base_filters * 2 ** level
        x = conv(x, filters, f"down{level}_a")
        x = conv(x, filters * 2, f"down{level}_b")
        skips.append(x)
        x = keras.layers.MaxPool3D(2, name=f"down{level}_pool")(x)
    x = conv(x, base_filters * 2 ** depth, "bottom_a")
    x = conv(x, base_filters * 2 ** (depth + 1), "bottom_b")
    for level in reversed(range(depth)):
        filters = base_filters * 2 ** (level + 1)
        x = keras.layers.Conv3DTranspose(filters * 2, 2, strides=2, name=f"up{level}_upconv")(x)
        x = keras.layers.Concatenate(name=f"up{level}_concat")([skips[level], x])
        x = conv(x, filters, f"up{level}_a")
        x = conv(x, filters, f"up{level}_b")
    outputs = keras.layers.Conv3D(classes, 1, activation="softmax", name="probabilities")(x)
    return keras.Model(inputs, outputs, name=name)


def unet3d_input_specs(resolution: int | tuple[int, int, int], *, channels: int = 4, batch: int | None = None,
                       depth: int | None = None):
    """``tf.TensorSpec``s of a volume and its labels (batch unknown by default).

    ``resolution``: the side of a cube, or the sides ``(D, H, W)``. With ``depth`` (the
    U-Net's), every side must be a multiple of ``2 ** depth``, or the skips would not line up
    with the upsampled tensors; a :class:`ConfigError` names the side otherwise.
    """
    sides = (resolution,) * 3 if isinstance(resolution, int) else tuple(resolution)
    if len(sides) != 3 or any(not isinstance(side, int) or side < 1 for side in sides):
        raise ConfigError(f"unet3d_input_specs: resolution must be a positive int or three of them (D, H, W), "
                          f"got {resolution!r}")
    if depth is not None:
        bad = [(axis, side) for axis, side in zip("DHW", sides) if side % 2 ** depth]
        if bad:
            raise ConfigError(f"unet3d_input_specs: sides {bad} of {sides} are not multiples of 2 ** depth = "
                              f"{2 ** depth}; a U-Net of depth {depth} halves each side {depth} times and "
                              f"concatenates the skips, so round them to a multiple of {2 ** depth}")
    return (tf.TensorSpec((batch, *sides, channels), tf.float32), tf.TensorSpec((batch, *sides), tf.int32))
