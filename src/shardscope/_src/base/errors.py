"""Exceptions. Every bad-input error is a ``ValueError`` subclass, so callers may catch either."""

from __future__ import annotations

from typing import TypeGuard


class _NamesParams(Exception):
    """An error that names the library parameters holding the bad values (``params``), and,
    where its fix is written in Python's words (``axis_types='auto'``), the same message in
    the command line's (``shell``: ``--axis-types auto``), or None."""

    def __init__(
        self, message: str, *, param: str | tuple[str, ...] = (), shell: str | None = None
    ) -> None:
        super().__init__(message)
        self.params: tuple[str, ...] = (param,) if isinstance(param, str) else tuple(param)
        self.shell = shell


class ShardscopeError(_NamesParams, ValueError):
    """Bad input to shardscope: the message names the value, the rule and the fix.

    ``params`` names the arguments of the library call that hold the bad values (empty when
    no one does), in the library's words; the command line tells its users the flags that
    set them, or, where the error has one, prints its ``shell`` message instead, which
    writes the fix with the flags themselves.

    >>> e = ShardscopeError("batch=0: must be positive", param="batch")
    >>> str(e), e.params
    ('batch=0: must be positive', ('batch',))
    """


class MeshSpecError(ShardscopeError):
    """A mesh description that cannot be built (bad syntax, sizes, names or device count)."""


class AxisTypeError(MeshSpecError):
    """An axis type that does not exist, or a mesh whose axis types the program's shardings do
    not fit (code written for Explicit axes on an Auto mesh, or the other way round)."""


class ShardingTypeCheckError(AxisTypeError):
    """Shardings that do not type-check on a mesh's Explicit axes for one layout: JAX cannot
    tell a result's sharding (a split dimension that does not divide, or code written for
    Auto axes). A search skips the layout; an audit of it fails. ``jax_said``: JAX's
    words (the first line)."""

    jax_said: str = ""


class LayoutError(ShardscopeError):
    """A shape and sharding that do not fit together (e.g. a dimension not divisible)."""


class HloParseError(ShardscopeError):
    """Text that is not optimized HLO, or HLO whose structure cannot be read."""


class OutputPathError(ShardscopeError):
    """A result file or folder that cannot be written where the user asked."""


class DeviceSetupError(_NamesParams, RuntimeError):
    """Devices that cannot be set up: simulated ones requested after JAX's backend started, or
    a multi-process run JAX could not join. ``params`` as in :class:`ShardscopeError`."""


class ModelConfigError(ShardscopeError):
    """A reference-model configuration that cannot be built (sizes, dtype, divisibility)."""


class StrategyError(ShardscopeError):
    """A sharding strategy or spec that does not fit the model, the mesh or the operands."""


class IndivisibleError(StrategyError):
    """A strategy that splits a model dimension over mesh axes whose sizes do not divide it:
    ``dim`` (``"experts"``) of ``size``, split ``ways`` ways over the mesh ``axes``
    (``"expert=16"``) of the ``roles`` (``"expert"``); ``fits`` is the widest split of it a
    mesh of these devices has."""

    def __init__(
        self,
        message: str,
        *,
        dim: str,
        size: int,
        ways: int,
        axes: str,
        roles: str,
        fits: int,
    ) -> None:
        super().__init__(message)
        self.dim = dim
        self.size = size
        self.ways = ways
        self.axes = axes
        self.roles = roles
        self.fits = fits


class PlanError(ShardscopeError):
    """A planning request that cannot be met (unknown preset, no device count, no plan)."""


class RulesError(PlanError):
    """Logical-axis rules that cannot be used: not ``(logical name, mesh axes)`` pairs, an
    axis the mesh does not have, an unreadable rules file, or no such rule set. A
    :class:`PlanError` too: the planner's callers catch it with the planner's other errors."""


class MissingMeshError(ShardscopeError):
    """A program names mesh axes with a bare PartitionSpec but was traced with no mesh set."""


class ProgramError(ShardscopeError):
    """A user's program that cannot be loaded or run as asked (no such file or function, or a
    ``make_step`` that does not return ``(step, args)``)."""


class ProfileError(ShardscopeError):
    """A profile that cannot be joined to its program: no trace where one was named, a trace
    without device events or of another program, or a step that failed to run."""


class AuditDiffError(ShardscopeError):
    """Audits that cannot be compared (unreadable, not an audit, another schema version)."""


class RecordError(ShardscopeError):
    """JSON read back as a record (``from_dict``) that is not one: a field missing or of
    another type than the record's."""


class TargetError(ShardscopeError):
    """A compile target that cannot be used: unknown, its compiler not installed, a device
    count it is not built with, or a mesh of other devices."""


class DeviceMemoryError(ShardscopeError):
    """A program that the target's compiler could not fit in the device's memory."""


def is_int(value: object, minimum: int | None = None) -> TypeGuard[int]:
    """Whether ``value`` is an integer (a bool is not) of at least ``minimum``: the one test
    every count, size and seed goes through.

    >>> is_int(8, minimum=1), is_int(True), is_int(0, minimum=1), is_int(2.0), is_int(-3)
    (True, False, False, False, True)
    """
    if isinstance(value, bool) or not isinstance(value, int):
        return False
    return minimum is None or value >= minimum


def one_line(error: BaseException) -> str:
    """An exception in one line: its type and the first line of its message.

    >>> one_line(ValueError("bad shape\\nmore")), one_line(KeyError())
    ('ValueError: bad shape', 'KeyError')
    """
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
