"""shardscope: show, check and plan how JAX shards arrays and what communication XLA inserts."""

from shardscope import comm as comm
from shardscope._audit import Audit as Audit
from shardscope._audit import Collective as Collective
from shardscope._audit import audit as audit
from shardscope._bounds import Bound as Bound
from shardscope._bounds import matmul_bound as matmul_bound
from shardscope._bounds import transformer_bound as transformer_bound
from shardscope._devices import hardware_summary as hardware_summary
from shardscope._devices import use_cpu_devices as use_cpu_devices
from shardscope._errors import DeviceSetupError as DeviceSetupError
from shardscope._errors import HloParseError as HloParseError
from shardscope._errors import LayoutError as LayoutError
from shardscope._errors import MeshSpecError as MeshSpecError
from shardscope._errors import ModelConfigError as ModelConfigError
from shardscope._errors import PlanError as PlanError
from shardscope._errors import ShardscopeError as ShardscopeError
from shardscope._errors import StrategyError as StrategyError
from shardscope._hardware import Hardware as Hardware
from shardscope._hardware import hardware as hardware
from shardscope._harness import Lab as Lab
from shardscope._harness import bootstrap as bootstrap
from shardscope._layout import DeviceShard as DeviceShard
from shardscope._layout import Layout as Layout
from shardscope._layout import layout as layout
from shardscope._layout import spec_layout as spec_layout
from shardscope._mesh import make_mesh as make_mesh
from shardscope._mesh import parse_mesh_spec as parse_mesh_spec
from shardscope._model import ModelConfig as ModelConfig
from shardscope._model_presets import MODEL_PRESETS as MODEL_PRESETS
from shardscope._numerics import compare_numerics as compare_numerics
from shardscope._plan import Plan as Plan
from shardscope._plan import PlanResult as PlanResult
from shardscope._plan import plan as plan
from shardscope._plot import plot_device_bytes as plot_device_bytes
from shardscope._programs import build_program as build_program
from shardscope._render_audit import render_audit as render_audit
from shardscope._strategies import STRATEGIES as STRATEGIES
from shardscope._strategies import Strategy as Strategy
from shardscope._strategies import get_strategy as get_strategy
from shardscope._verdict import Verdict as Verdict
from shardscope._verdict import matmul_verdict as matmul_verdict
from shardscope._verdict import transformer_verdict as transformer_verdict

__version__ = "0.1.0"
