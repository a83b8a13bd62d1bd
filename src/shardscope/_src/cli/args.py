"""argparse value types shared by the command line's option groups: strict whole numbers
(ASCII digits only, no underscores) and positive seconds, with messages that name the value."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def _whole(text: str) -> int:
    digits = text.strip().removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    if len(digits.lstrip("0")) > 18:  # past any count or size the tool takes, and int64
        raise argparse.ArgumentTypeError(
            f"a {len(digits.lstrip('0'))}-digit number is larger than any value this takes"
        )
    return int(text)


def nonnegative_int(text: str) -> int:
    value = _whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def positive_int(text: str) -> int:
    value = _whole(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive whole number")
    return value


def positive_number(text: str, unit: str = "") -> float:
    """A finite number above 0 (``450e9``), for bandwidths, sizes and times."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 450e9)") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a positive number{unit}")
    return value


def positive_float(text: str) -> float:
    """Seconds above 0."""
    return positive_number(text, " of seconds")


#: Library parameters whose flag is not the parameter spelled with dashes.
FLAG_OF = {
    "detect": "--distributed",
    "out_dir": "--out",
    "memory_bytes": "--memory",
    "a_spec": "--a-spec",
}


def flags_of(params: Sequence[str]) -> str:
    """`` (flags --d-model, --ff)``: the flags that set the parameters an error names."""
    if not params:
        return ""
    flags = [FLAG_OF.get(p, "--" + p.replace("_", "-")) for p in params]
    return f" ({'flag' if len(flags) == 1 else 'flags'} {', '.join(flags)})"
