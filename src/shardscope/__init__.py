"""shardscope: show, check and plan how JAX shards arrays and what communication XLA inserts.

Importing shardscope loads none of it: each name below is imported on first use, so that
``import shardscope`` neither imports JAX nor changes anything in the process (its
environment, its file descriptors) and a command loads only the modules it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardscope import comm as comm
    from shardscope._src.audit.compile import audit as audit
    from shardscope._src.audit.compile import audit_program as audit_program
    from shardscope._src.audit.diff import AuditDiff as AuditDiff
    from shardscope._src.audit.diff import diff_audits as diff_audits
    from shardscope._src.audit.expect import expect_collectives as expect_collectives
    from shardscope._src.audit.records import Audit as Audit
    from shardscope._src.audit.records import Collective as Collective
    from shardscope._src.base.comm import CollectiveKind as CollectiveKind
    from shardscope._src.base.devices import hardware_summary as hardware_summary
    from shardscope._src.base.devices import use_cpu_devices as use_cpu_devices
    from shardscope._src.base.distributed import initialize_distributed as initialize_distributed
    from shardscope._src.base.errors import AuditDiffError as AuditDiffError
    from shardscope._src.base.errors import AxisTypeError as AxisTypeError
    from shardscope._src.base.errors import DeviceMemoryError as DeviceMemoryError
    from shardscope._src.base.errors import DeviceSetupError as DeviceSetupError
    from shardscope._src.base.errors import HloParseError as HloParseError
    from shardscope._src.base.errors import LayoutError as LayoutError
    from shardscope._src.base.errors import MeshSpecError as MeshSpecError
    from shardscope._src.base.errors import MissingMeshError as MissingMeshError
    from shardscope._src.base.errors import ModelConfigError as ModelConfigError
    from shardscope._src.base.errors import PlanError as PlanError
    from shardscope._src.base.errors import ProfileError as ProfileError
    from shardscope._src.base.errors import ProgramError as ProgramError
    from shardscope._src.base.errors import RecordError as RecordError
    from shardscope._src.base.errors import RulesError as RulesError
    from shardscope._src.base.errors import ShardscopeError as ShardscopeError
    from shardscope._src.base.errors import StrategyError as StrategyError
    from shardscope._src.base.errors import TargetError as TargetError
    from shardscope._src.base.records import VERSION as _VERSION
    from shardscope._src.bounds.matmul import MatmulSchedule as MatmulSchedule
    from shardscope._src.bounds.matmul import matmul_bound as matmul_bound
    from shardscope._src.bounds.matmul import matmul_schedule as matmul_schedule
    from shardscope._src.bounds.terms import Bound as Bound
    from shardscope._src.bounds.transformer import transformer_bound as transformer_bound
    from shardscope._src.lab.harness import Lab as Lab
    from shardscope._src.lab.harness import bootstrap as bootstrap
    from shardscope._src.launch import LaunchResult as LaunchResult
    from shardscope._src.launch import launch as launch
    from shardscope._src.layout import DeviceShard as DeviceShard
    from shardscope._src.layout import Layout as Layout
    from shardscope._src.layout import LeafLayout as LeafLayout
    from shardscope._src.layout import TreeLayout as TreeLayout
    from shardscope._src.layout import abstract as abstract
    from shardscope._src.layout import layout as layout
    from shardscope._src.layout import spec_layout as spec_layout
    from shardscope._src.layout import tree_layout as tree_layout
    from shardscope._src.mesh import make_mesh as make_mesh
    from shardscope._src.mesh import parse_mesh_spec as parse_mesh_spec
    from shardscope._src.model.config import Mode as Mode
    from shardscope._src.model.config import ModelConfig as ModelConfig
    from shardscope._src.model.config import Remat as Remat
    from shardscope._src.model.presets import MODEL_PRESETS as MODEL_PRESETS
    from shardscope._src.model.remat import RematPolicy as RematPolicy
    from shardscope._src.model.remat import remat_policy as remat_policy
    from shardscope._src.plan.request import PlanRequest as PlanRequest
    from shardscope._src.plan.request import ProgramRequest as ProgramRequest
    from shardscope._src.plan.request import ServeRequest as ServeRequest
    from shardscope._src.plan.request import SuggestRequest as SuggestRequest
    from shardscope._src.profile.records import Profile as Profile
    from shardscope._src.profile.run import profile as profile
    from shardscope._src.profile.run import profile_trace as profile_trace
    from shardscope._src.program.program import ProgramPlan as ProgramPlan
    from shardscope._src.program.program import ProgramPlanResult as ProgramPlanResult
    from shardscope._src.program.program import plan_program as plan_program
    from shardscope._src.program.program import plan_program_request as plan_program_request
    from shardscope._src.render.audit import render_audit as render_audit
    from shardscope._src.render.plots import plot_device_bytes as plot_device_bytes
    from shardscope._src.render.profile import render_profile as render_profile
    from shardscope._src.render.profile_plot import (
        plot_profile_timeline as plot_profile_timeline,
    )
    from shardscope._src.serve.search import serve as serve
    from shardscope._src.serve.search import serve_request as serve_request
    from shardscope._src.serve.types import ServePlan as ServePlan
    from shardscope._src.serve.types import ServeResult as ServeResult
    from shardscope._src.sharding.numerics import compare_numerics as compare_numerics
    from shardscope._src.sharding.parallelism import DataParallel as DataParallel
    from shardscope._src.sharding.parallelism import Parallelism as Parallelism
    from shardscope._src.sharding.parallelism import Tensor as Tensor
    from shardscope._src.sharding.programs import (
        build_reference_program as build_program,  # noqa: F401 (its old name, kept working)
    )
    from shardscope._src.sharding.programs import (
        build_reference_program as build_reference_program,
    )
    from shardscope._src.sharding.rules import logical_to_spec as logical_to_spec
    from shardscope._src.sharding.strategies import ALL_STRATEGIES as ALL_STRATEGIES
    from shardscope._src.sharding.strategies import STRATEGIES as STRATEGIES
    from shardscope._src.sharding.strategies import Placement as Placement
    from shardscope._src.sharding.strategies import Role as Role
    from shardscope._src.sharding.strategies import Strategy as Strategy
    from shardscope._src.sharding.strategies import compose as compose
    from shardscope._src.sharding.strategies import get_strategy as get_strategy
    from shardscope._src.suggest.suggest import Proposal as Proposal
    from shardscope._src.suggest.suggest import SuggestResult as SuggestResult
    from shardscope._src.suggest.suggest import suggest as suggest
    from shardscope._src.suggest.suggest import suggest_request as suggest_request
    from shardscope._src.targets.capabilities import Capabilities as Capabilities
    from shardscope._src.targets.hardware import Hardware as Hardware
    from shardscope._src.targets.hardware import h100_attention as h100_attention
    from shardscope._src.targets.hardware import hardware as hardware
    from shardscope._src.targets.mesh import target_mesh as target_mesh
    from shardscope._src.targets.specs import TARGETS as TARGETS
    from shardscope._src.targets.specs import Target as Target
    from shardscope._src.train.sweep import plan as plan
    from shardscope._src.train.sweep import plan_request as plan_request
    from shardscope._src.train.types import Plan as Plan
    from shardscope._src.train.types import PlanResult as PlanResult
    from shardscope._src.verdict import Verdict as Verdict
    from shardscope._src.verdict import matmul_verdict as matmul_verdict
    from shardscope._src.verdict import transformer_verdict as transformer_verdict

    __version__: str = _VERSION

#: Every public name: the module it lives in and its name there (None: the module itself).
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "comm": ("shardscope.comm", None),
    "audit": ("shardscope._src.audit.compile", "audit"),
    "audit_program": ("shardscope._src.audit.compile", "audit_program"),
    "AuditDiff": ("shardscope._src.audit.diff", "AuditDiff"),
    "diff_audits": ("shardscope._src.audit.diff", "diff_audits"),
    "expect_collectives": ("shardscope._src.audit.expect", "expect_collectives"),
    "Audit": ("shardscope._src.audit.records", "Audit"),
    "Collective": ("shardscope._src.audit.records", "Collective"),
    "Capabilities": ("shardscope._src.targets.capabilities", "Capabilities"),
    "CollectiveKind": ("shardscope._src.base.comm", "CollectiveKind"),
    "hardware_summary": ("shardscope._src.base.devices", "hardware_summary"),
    "use_cpu_devices": ("shardscope._src.base.devices", "use_cpu_devices"),
    "initialize_distributed": ("shardscope._src.base.distributed", "initialize_distributed"),
    "AuditDiffError": ("shardscope._src.base.errors", "AuditDiffError"),
    "AxisTypeError": ("shardscope._src.base.errors", "AxisTypeError"),
    "DeviceMemoryError": ("shardscope._src.base.errors", "DeviceMemoryError"),
    "DeviceSetupError": ("shardscope._src.base.errors", "DeviceSetupError"),
    "HloParseError": ("shardscope._src.base.errors", "HloParseError"),
    "LayoutError": ("shardscope._src.base.errors", "LayoutError"),
    "MeshSpecError": ("shardscope._src.base.errors", "MeshSpecError"),
    "MissingMeshError": ("shardscope._src.base.errors", "MissingMeshError"),
    "ModelConfigError": ("shardscope._src.base.errors", "ModelConfigError"),
    "PlanError": ("shardscope._src.base.errors", "PlanError"),
    "ProfileError": ("shardscope._src.base.errors", "ProfileError"),
    "ProgramError": ("shardscope._src.base.errors", "ProgramError"),
    "RecordError": ("shardscope._src.base.errors", "RecordError"),
    "RulesError": ("shardscope._src.base.errors", "RulesError"),
    "ShardscopeError": ("shardscope._src.base.errors", "ShardscopeError"),
    "StrategyError": ("shardscope._src.base.errors", "StrategyError"),
    "TargetError": ("shardscope._src.base.errors", "TargetError"),
    "__version__": ("shardscope._src.base.records", "VERSION"),
    "MatmulSchedule": ("shardscope._src.bounds.matmul", "MatmulSchedule"),
    "matmul_bound": ("shardscope._src.bounds.matmul", "matmul_bound"),
    "matmul_schedule": ("shardscope._src.bounds.matmul", "matmul_schedule"),
    "Bound": ("shardscope._src.bounds.terms", "Bound"),
    "transformer_bound": ("shardscope._src.bounds.transformer", "transformer_bound"),
    "Lab": ("shardscope._src.lab.harness", "Lab"),
    "bootstrap": ("shardscope._src.lab.harness", "bootstrap"),
    "LaunchResult": ("shardscope._src.launch", "LaunchResult"),
    "launch": ("shardscope._src.launch", "launch"),
    "DeviceShard": ("shardscope._src.layout", "DeviceShard"),
    "Layout": ("shardscope._src.layout", "Layout"),
    "LeafLayout": ("shardscope._src.layout", "LeafLayout"),
    "TreeLayout": ("shardscope._src.layout", "TreeLayout"),
    "abstract": ("shardscope._src.layout", "abstract"),
    "layout": ("shardscope._src.layout", "layout"),
    "spec_layout": ("shardscope._src.layout", "spec_layout"),
    "tree_layout": ("shardscope._src.layout", "tree_layout"),
    "make_mesh": ("shardscope._src.mesh", "make_mesh"),
    "parse_mesh_spec": ("shardscope._src.mesh", "parse_mesh_spec"),
    "Mode": ("shardscope._src.model.config", "Mode"),
    "ModelConfig": ("shardscope._src.model.config", "ModelConfig"),
    "Remat": ("shardscope._src.model.config", "Remat"),
    "RematPolicy": ("shardscope._src.model.remat", "RematPolicy"),
    "remat_policy": ("shardscope._src.model.remat", "remat_policy"),
    "MODEL_PRESETS": ("shardscope._src.model.presets", "MODEL_PRESETS"),
    "Profile": ("shardscope._src.profile.records", "Profile"),
    "profile": ("shardscope._src.profile.run", "profile"),
    "profile_trace": ("shardscope._src.profile.run", "profile_trace"),
    "ProgramPlan": ("shardscope._src.program.program", "ProgramPlan"),
    "ProgramPlanResult": ("shardscope._src.program.program", "ProgramPlanResult"),
    "plan_program": ("shardscope._src.program.program", "plan_program"),
    "plan_program_request": ("shardscope._src.program.program", "plan_program_request"),
    "Proposal": ("shardscope._src.suggest.suggest", "Proposal"),
    "SuggestResult": ("shardscope._src.suggest.suggest", "SuggestResult"),
    "suggest": ("shardscope._src.suggest.suggest", "suggest"),
    "suggest_request": ("shardscope._src.suggest.suggest", "suggest_request"),
    "serve": ("shardscope._src.serve.search", "serve"),
    "serve_request": ("shardscope._src.serve.search", "serve_request"),
    "ServePlan": ("shardscope._src.serve.types", "ServePlan"),
    "ServeResult": ("shardscope._src.serve.types", "ServeResult"),
    "PlanRequest": ("shardscope._src.plan.request", "PlanRequest"),
    "ServeRequest": ("shardscope._src.plan.request", "ServeRequest"),
    "ProgramRequest": ("shardscope._src.plan.request", "ProgramRequest"),
    "SuggestRequest": ("shardscope._src.plan.request", "SuggestRequest"),
    "plan": ("shardscope._src.train.sweep", "plan"),
    "plan_request": ("shardscope._src.train.sweep", "plan_request"),
    "Plan": ("shardscope._src.train.types", "Plan"),
    "PlanResult": ("shardscope._src.train.types", "PlanResult"),
    "render_audit": ("shardscope._src.render.audit", "render_audit"),
    "render_profile": ("shardscope._src.render.profile", "render_profile"),
    "plot_profile_timeline": ("shardscope._src.render.profile_plot", "plot_profile_timeline"),
    "plot_device_bytes": ("shardscope._src.render.plots", "plot_device_bytes"),
    "compare_numerics": ("shardscope._src.sharding.numerics", "compare_numerics"),
    "logical_to_spec": ("shardscope._src.sharding.rules", "logical_to_spec"),
    "build_program": ("shardscope._src.sharding.programs", "build_reference_program"),
    "build_reference_program": ("shardscope._src.sharding.programs", "build_reference_program"),
    "DataParallel": ("shardscope._src.sharding.parallelism", "DataParallel"),
    "Parallelism": ("shardscope._src.sharding.parallelism", "Parallelism"),
    "Tensor": ("shardscope._src.sharding.parallelism", "Tensor"),
    "ALL_STRATEGIES": ("shardscope._src.sharding.strategies", "ALL_STRATEGIES"),
    "STRATEGIES": ("shardscope._src.sharding.strategies", "STRATEGIES"),
    "compose": ("shardscope._src.sharding.strategies", "compose"),
    "Placement": ("shardscope._src.sharding.strategies", "Placement"),
    "Role": ("shardscope._src.sharding.strategies", "Role"),
    "Strategy": ("shardscope._src.sharding.strategies", "Strategy"),
    "get_strategy": ("shardscope._src.sharding.strategies", "get_strategy"),
    "Hardware": ("shardscope._src.targets.hardware", "Hardware"),
    "hardware": ("shardscope._src.targets.hardware", "hardware"),
    "h100_attention": ("shardscope._src.targets.hardware", "h100_attention"),
    "target_mesh": ("shardscope._src.targets.mesh", "target_mesh"),
    "TARGETS": ("shardscope._src.targets.specs", "TARGETS"),
    "Target": ("shardscope._src.targets.specs", "Target"),
    "Verdict": ("shardscope._src.verdict", "Verdict"),
    "matmul_verdict": ("shardscope._src.verdict", "matmul_verdict"),
    "transformer_verdict": ("shardscope._src.verdict", "transformer_verdict"),
}

__all__ = sorted(name for name in _EXPORTS if not name.startswith("_"))


def __getattr__(name: str) -> Any:
    try:
        module, attr = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'shardscope' has no attribute {name!r}") from None
    found = importlib.import_module(module)
    value = found if attr is None else getattr(found, attr)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
