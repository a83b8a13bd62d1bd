"""The one rule for compiled bytes against a bound, and its one tolerance.

A bound here is the bytes a formula says a schedule sends (the verdict's minimum, or the
planner's formula of a plan's schedule). Compiled bytes **match** it when they are within
:data:`TOLERANCE` of it on either side; above that they **exceed** it (the program sends
more than the schedule needs), below it they **undercut** it (the formula counts traffic
the compiled program does without: the formula is wrong for it, not the program). Each
user reads the standing the same way:

* the verdict calls a program optimal when it does not exceed its minimum, and notes an
  undercut (a minimum the program beats is not a minimum of that program);
* the planner's validation holds only on a match: its time model spends the formula's bytes,
  so a formula that undercounts or overcounts the compiled program fails it either way.

>>> [str(standing(b, 100)) for b in (95, 105, 106, 94)], str(standing(0, 0))
(['matches', 'matches', 'exceeds', 'undercuts'], 'matches')
"""

from __future__ import annotations

from enum import StrEnum

#: How far compiled bytes may be from the bound, as a fraction of it, and still match.
TOLERANCE = 0.05


class Standing(StrEnum):
    """Where compiled bytes stand against a bound (see the module's rule)."""

    MATCHES = "matches"
    EXCEEDS = "exceeds"
    UNDERCUTS = "undercuts"


def standing(compiled_bytes: int, bound_bytes: int) -> Standing:
    """Where ``compiled_bytes`` stand against ``bound_bytes``: within :data:`TOLERANCE` of it
    either way they match; a bound of 0 is matched only by 0."""
    slack = TOLERANCE * bound_bytes
    if compiled_bytes > bound_bytes + slack:
        return Standing.EXCEEDS
    if compiled_bytes < bound_bytes - slack:
        return Standing.UNDERCUTS
    return Standing.MATCHES


def within_bound(compiled_bytes: int, bound_bytes: int) -> bool:
    """Whether ``compiled_bytes`` do not exceed ``bound_bytes`` (they match or undercut it)."""
    return standing(compiled_bytes, bound_bytes) is not Standing.EXCEEDS
