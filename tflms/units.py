"""Human-friendly parsing of byte quantities ("16GiB", "512 MB", 1024)."""

from __future__ import annotations

import math
import re

from tflms.errors import UnitsError

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
#: The largest byte count accepted (int64, what TensorFlow and numpy count bytes in).
MAX_BYTES = 2**63 - 1
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_bytes(value: int | str, *, what: str = "size") -> int:
    """Return ``value`` as a whole number of bytes.

    Integers are taken as bytes. Strings need a unit: ``B``, ``KB``/``MB``/``GB``/
    ``TB`` (powers of 1000) or ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024),
    case-insensitive. ``what`` names the quantity in error messages.
    """
    if isinstance(value, bool):
        raise UnitsError(f"{what}: expected a byte count or a string such as '16GiB', got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise UnitsError(f"{what}: a byte count cannot be negative, got {value}")
        if value > MAX_BYTES:
            raise _too_large(what, value)
        return value
    if isinstance(value, float):
        raise UnitsError(
            f"{what}: got the float {value!r}; give whole bytes (int) or a string with units such as '1.5GiB'")
    if not isinstance(value, str):
        raise UnitsError(f"{what}: expected int bytes or a string such as '16GiB', got {type(value).__name__}")
    match = _PATTERN.match(value)
    if not match:
        raise UnitsError(f"{what}: cannot read {value!r}; write a number and a unit, e.g. '16GiB' or '512MB'")
    number, unit = float(match.group(1)), match.group(2).lower()
    if not unit:
        raise UnitsError(
            f"{what}: {value!r} has no unit; write e.g. '{match.group(1)}GiB' or pass an int number of bytes")
    if unit not in _UNITS:
        raise UnitsError(
            f"{what}: unknown unit {match.group(2)!r} in {value!r}; use one of B, KB, MB, GB, TB, KiB, MiB, GiB, TiB")
    total = number * _UNITS[unit]
    if not math.isfinite(total) or total > MAX_BYTES:
        raise _too_large(what, value)
    return int(round(total))


def _too_large(what: str, value: int | str) -> UnitsError:
    return UnitsError(f"{what}: {value!r} is too large: at most {MAX_BYTES} bytes (8 EiB) can be counted; give a "
                      "real size such as '16GiB'")


def format_bytes(num_bytes: int | float) -> str:
    """Format a byte count for people: ``format_bytes(3 * 2**20) == '3.00 MiB'``."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
