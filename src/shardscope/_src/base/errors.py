"""Exceptions. Every bad-input error is a ``ValueError`` subclass, so callers may catch either."""

from __future__ import annotations


class ShardscopeError(ValueError):
    """Bad input to shardscope: the message names the value, the rule and the fix."""


class MeshSpecError(ShardscopeError):
    """A mesh description that cannot be built (bad syntax, sizes, names or device count)."""


class LayoutError(ShardscopeError):
    """A shape and sharding that do not fit together (e.g. a dimension not divisible)."""


class HloParseError(ShardscopeError):
    """Text that is not optimized HLO, or HLO whose structure cannot be read."""


class OutputPathError(ShardscopeError):
    """A result file or folder that cannot be written where the user asked."""


class DeviceSetupError(RuntimeError):
    """Simulated devices were requested after JAX's backend had already started."""


class ModelConfigError(ShardscopeError):
    """A reference-model configuration that cannot be built (sizes, dtype, divisibility)."""


class StrategyError(ShardscopeError):
    """A sharding strategy or spec that does not fit the model, the mesh or the operands."""


class PlanError(ShardscopeError):
    """A planning request that cannot be met (unknown preset, no device count, no plan)."""


class MissingMeshError(ShardscopeError):
    """A program names mesh axes with a bare PartitionSpec but was traced with no mesh set."""


class ProgramError(ShardscopeError):
    """A user's program that cannot be loaded or run as asked (no such file or function, or a
    ``make_step`` that does not return ``(step, args)``)."""


class AuditDiffError(ShardscopeError):
    """Audits that cannot be compared (unreadable, not an audit, another schema version)."""


class TargetError(ShardscopeError):
    """A compile target that cannot be used: unknown, its compiler not installed, a device
    count it is not built with, or a mesh of other devices."""


class DeviceMemoryError(ShardscopeError):
    """A program that the target's compiler could not fit in the device's memory."""
