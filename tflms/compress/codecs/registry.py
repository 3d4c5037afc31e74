"""The codecs by name: :data:`CODEC_NAMES`, :func:`get_codec`, and the lossy-codec guard."""

from __future__ import annotations

from tflms.compress.codecs.base import Codec
from tflms.compress.codecs.cast import BFloat16Codec, Float16Codec
from tflms.compress.codecs.int8 import BlockInt8Codec
from tflms.compress.codecs.zvc import ZeroValueCodec
from tflms.errors import ConfigError

_CODECS: dict[str, type[Codec]] = {
    ZeroValueCodec.name: ZeroValueCodec,
    Float16Codec.name: Float16Codec,
    BFloat16Codec.name: BFloat16Codec,
    BlockInt8Codec.name: BlockInt8Codec,
}
CODEC_NAMES: tuple[str, ...] = tuple(_CODECS)
"""Names accepted by :func:`get_codec`."""


def get_codec(name: str) -> Codec:
    """Return the codec called ``name`` (one of :data:`CODEC_NAMES`) with default parameters."""
    codec_type = _CODECS.get(name) if isinstance(name, str) else None
    if codec_type is None:
        raise ConfigError(f"unknown codec {name!r}; valid names: {', '.join(CODEC_NAMES)}")
    return codec_type()


def require_lossless_allowed(codec: Codec, allow_lossy: bool) -> Codec:
    """Return ``codec`` unless it is lossy and ``allow_lossy`` is false, which raises :class:`ConfigError`."""
    if not codec.lossless and not allow_lossy:
        lossless = ", ".join(n for n, c in _CODECS.items() if c.lossless)
        raise ConfigError(
            f"codec {codec.name!r} is lossy (it changes activation values); pass allow_lossy=True to accept "
            f"that, or use a lossless codec: {lossless}")
    return codec
