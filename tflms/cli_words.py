"""What the ``tflms`` command prints speaks its flags, not the Python API's keywords.

Messages written for both audiences name the API spelling followed by the
flag in parentheses, e.g. ``"pass replace=True (--replace)"`` or ``"give
batch_size=N (--batch-size N)"``; :func:`speak_flags` keeps the flag only. API
keywords a message names on their own (``"swapout_threshold must be >= 1"``,
``"compress='auto' measures ..."``) become the command's flags. This module is
the one place that maps API words to flags; it imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
import re

from tflms.config import LMSConfig

#: API keyword -> command-line flag, for every keyword a flag of the command sets.
FLAGS: dict[str, str] = {
    **{f.name: "--" + f.name.replace("_", "-") for f in dataclasses.fields(LMSConfig)},
    "budget_bytes": "--budget", "budget": "--budget", "replace": "--replace", "verify": "--verify",
    "functions": "--function", "wide": "--wide",
}

_VALUE = r"(?:'[^']*'|\"[^\"]*\"|[^\s(),;]*)"
#: ``API (--flag ...)``: a call such as ``table(wide=True)`` or an assignment such as ``batch_size=N``,
#: followed by its flag in parentheses.
_PAIRED = re.compile(r"(?:[\w.]+\([^()]*\)|[\w.]+=" + _VALUE + r")\s\((--[^()]*)\)")
_ASSIGNED = re.compile(r"(?<![\w/.:-])(" + "|".join(sorted(FLAGS, key=len, reverse=True)) + r")=(" + _VALUE + ")")
#: Keywords with an underscore are never English words: translated where they stand alone.
_BARE = re.compile(r"(?<![\w/.:'\"-])(" + "|".join(sorted((k for k in FLAGS if "_" in k), key=len, reverse=True))
                   + r")(?![\w/=(]|:\d)")


def _assigned(match: re.Match) -> str:
    flag, value = FLAGS[match.group(1)], match.group(2).strip("'\"")
    return flag if value == "True" else f"{flag} {value}"


def speak_flags(text: str) -> str:
    """``text`` with API keywords replaced by the ``tflms`` command's flags (see the module doc)."""
    text = _PAIRED.sub(lambda m: m.group(1), text)
    text = _ASSIGNED.sub(_assigned, text)
    return _BARE.sub(lambda m: FLAGS[m.group(1)], text)
