"""shardscope: show, check and plan how JAX shards arrays and what communication XLA inserts."""

from shardscope import comm as comm
from shardscope._src.audit.compile import audit as audit
from shardscope._src.audit.diff import AuditDiff as AuditDiff
from shardscope._src.audit.diff import diff_audits as diff_audits
from shardscope._src.audit.expect import expect_collectives as expect_collectives
from shardscope._src.audit.records import Audit as Audit
from shardscope._src.audit.records import Collective as Collective
from shardscope._src.base.deviceless import prepare_environment as _prepare_environment
from shardscope._src.base.devices import hardware_summary as hardware_summary
from shardscope._src.base.devices import use_cpu_devices as use_cpu_devices
from shardscope._src.base.distributed import initialize_distributed as initialize_distributed
from shardscope._src.base.errors import AuditDiffError as AuditDiffError
from shardscope._src.base.errors import DeviceMemoryError as DeviceMemoryError
from shardscope._src.base.errors import DeviceSetupError as DeviceSetupError
from shardscope._src.base.errors import HloParseError as HloParseError
from shardscope._src.base.errors import LayoutError as LayoutError
from shardscope._src.base.errors import MeshSpecError as MeshSpecError
from shardscope._src.base.errors import MissingMeshError as MissingMeshError
from shardscope._src.base.errors import ModelConfigError as ModelConfigError
from shardscope._src.base.errors import PlanError as PlanError
from shardscope._src.base.errors import ProgramError as ProgramError
from shardscope._src.base.errors import ShardscopeError as ShardscopeError
from shardscope._src.base.errors import StrategyError as StrategyError
from shardscope._src.base.errors import TargetError as TargetError
from shardscope._src.base.hardware import Hardware as Hardware
from shardscope._src.base.hardware import hardware as hardware
from shardscope._src.base.io import VERSION as _VERSION
from shardscope._src.base.targets import TARGETS as TARGETS
from shardscope._src.base.targets import Target as Target
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
from shardscope._src.layout import logical_to_spec as logical_to_spec
from shardscope._src.layout import spec_layout as spec_layout
from shardscope._src.layout import tree_layout as tree_layout
from shardscope._src.mesh import make_mesh as make_mesh
from shardscope._src.mesh import parse_mesh_spec as parse_mesh_spec
from shardscope._src.model.config import ModelConfig as ModelConfig
from shardscope._src.model.presets import MODEL_PRESETS as MODEL_PRESETS
from shardscope._src.plan.program import ProgramPlan as ProgramPlan
from shardscope._src.plan.program import ProgramPlanResult as ProgramPlanResult
from shardscope._src.plan.program import plan_program as plan_program
from shardscope._src.plan.sweep import plan as plan
from shardscope._src.plan.types import Plan as Plan
from shardscope._src.plan.types import PlanResult as PlanResult
from shardscope._src.render.audit import render_audit as render_audit
from shardscope._src.render.plots import plot_device_bytes as plot_device_bytes
from shardscope._src.sharding.numerics import compare_numerics as compare_numerics
from shardscope._src.sharding.programs import build_program as build_program
from shardscope._src.sharding.strategies import STRATEGIES as STRATEGIES
from shardscope._src.sharding.strategies import Strategy as Strategy
from shardscope._src.sharding.strategies import get_strategy as get_strategy
from shardscope._src.target_mesh import target_mesh as target_mesh
from shardscope._src.verdict import Verdict as Verdict
from shardscope._src.verdict import matmul_verdict as matmul_verdict
from shardscope._src.verdict import transformer_verdict as transformer_verdict

__version__: str = _VERSION

# Before JAX starts a backend: lets the optional GPU/TPU compilers register quietly on a host
# without those chips (only variables the user has not set; nothing on a host that has them).
_prepare_environment()
