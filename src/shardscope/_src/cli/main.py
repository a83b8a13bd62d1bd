"""The ``shardscope`` command: a thin shell over the library.

A user error prints one line on stderr and exits 2 (``--debug`` shows the traceback).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import jax

from shardscope._src.audit.stages import check_program_ref
from shardscope._src.base.comm import KINDS
from shardscope._src.base.deviceless import start_jax
from shardscope._src.base.distributed import leave_run_on_failure
from shardscope._src.base.errors import (
    DeviceSetupError,
    MeshSpecError,
    PlanError,
    ShardscopeError,
    TargetError,
)
from shardscope._src.base.hardware import PRESETS
from shardscope._src.base.io import STDOUT, check_dir_path, check_output_paths, result_header
from shardscope._src.base.targets import CPU, TARGETS, get_target, topology
from shardscope._src.cli.args import (
    NO_FLAGS,
    positive_float,
    positive_int,
    positive_number,
)
from shardscope._src.cli.audit import run_audit_command
from shardscope._src.cli.config import (
    AuditConfig,
    AuditHloConfig,
    AuditMatmulConfig,
    AuditProgramConfig,
    AuditReshardConfig,
    AuditTransformerConfig,
    CommandConfig,
    DiffConfig,
    LabConfig,
    LaunchConfig,
    PlanConfig,
)
from shardscope._src.cli.distributed import add_distributed_options
from shardscope._src.cli.plan import run_plan_command
from shardscope._src.cli.program import (
    _hlo_file,
    _mesh_needed,
    run_audit_hlo,
    run_audit_program,
    run_diff,
    run_plan_program,
)
from shardscope._src.cli.transformer import (
    check_matmul_command,
    check_transformer_command,
    run_matmul_command,
    run_transformer_command,
)
from shardscope._src.lab import taster
from shardscope._src.launch import (
    check_launch_command,
    check_launch_size,
    die_with_launcher,
    launch,
)
from shardscope._src.mesh import ensure_devices_for, parse_mesh_spec
from shardscope._src.model.presets import MODEL_PRESETS
from shardscope._src.render.console import output_console
from shardscope._src.sharding.demos import check_demo
from shardscope._src.sharding.strategies import STRATEGIES

PROG = "shardscope"


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A sub-command's defaults overwrite its parent's: after parsing, ``command_parser`` is
        # the parser of the sub-command that runs, whose options name the library's parameters.
        self.set_defaults(command_parser=self)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message} (see '{self.prog} --help')")

    # argparse converts every option value here, whatever group or parser added the option:
    # the one place where an empty value (--mesh '') is refused for every flag at once.
    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        if action.option_strings and not arg_string.strip():
            raise argparse.ArgumentError(action, "is empty; give it a value")
        return super()._get_value(action, arg_string)


def _check_lab(c: LabConfig) -> None:

    check_dir_path(c.out)


def _cmd_lab(c: LabConfig) -> int:

    c.multiprocess.initialize()
    lab, summary = taster.run(devices=c.devices, out_dir=c.out)
    return 0 if summary["passed"] == summary["total"] else 1


def _check_audit(c: AuditConfig) -> None:
    """Everything ``audit`` can refuse before JAX starts (also run by ``launch``, once)."""

    target = _audit_target(c)  # a target that cannot take these options
    hlo = c.hlo if isinstance(c, AuditHloConfig) else None
    check_output_paths({"--json": c.json}, {"--hlo": hlo})
    mesh = c.mesh_or_default
    if mesh and c.devices and not c.multiprocess.detect and target is None:
        _check_mesh_fits(mesh, c.devices, c.multiprocess.num_processes)
    if target is not None and mesh:
        topology(target, math.prod(parse_mesh_spec(mesh).values()))  # a count it comes in
    if isinstance(c, AuditProgramConfig):
        _mesh_needed(c.mesh, f"auditing {c.program_ref}")
        check_program_ref(c.program_ref)
    elif isinstance(c, AuditHloConfig):
        _mesh_needed(c.mesh, f"auditing --hlo {c.hlo}")
        _hlo_file(c.hlo)
    elif isinstance(c, AuditReshardConfig):
        check_demo("reshard", mesh)
    elif isinstance(c, AuditMatmulConfig):
        check_matmul_command(mesh, c.m, c.k, c.n, c.dtype, c.a_spec, c.b_spec, c.out_spec)
    elif isinstance(c, AuditTransformerConfig):
        check_transformer_command(c.strategy, c.mesh, **c.sizes)


def _check_mesh_fits(mesh: str, devices: int, num_processes: int | None) -> None:
    """Refuses a mesh larger than the simulated devices of this run."""
    need = math.prod(parse_mesh_spec(mesh).values())
    if num_processes is None and need > devices:
        raise MeshSpecError(
            f"mesh {mesh!r} needs {need} devices but --devices {devices} simulates "
            f"{devices}; give --devices {need} or a smaller mesh"
        )
    if num_processes is not None and need > devices * num_processes:
        have = devices * num_processes
        raise MeshSpecError(
            f"mesh {mesh!r} needs {need} devices but {num_processes} processes of "
            f"{devices} devices hold {have}; give more processes or devices, or a "
            f"smaller mesh"
        )


def _cmd_audit(c: AuditConfig) -> int:

    target = _audit_target(c)
    if target is not None:
        if c.json is not None and c.json == STDOUT:
            return _run_audit_program(c, c.json, output_console(stderr=True), target)
        return _run_audit_program(c, c.json, None, target)
    c.multiprocess.initialize()
    ensure_devices_for(c.mesh_or_default, c.devices)

    json_path, console = c.json, None
    if json_path == STDOUT:  # the JSON owns standard output; tables go to standard error
        console = output_console(stderr=True)
    if jax.process_index() != 0:  # every process compiles the same program; 0 reports it
        from rich.console import Console

        json_path, console = None, Console(quiet=True)
    return _run_audit_program(c, json_path, console, None)


def _audit_target(c: AuditConfig) -> str | None:
    """The GPU/TPU target of ``audit --target``, or None for simulated CPU devices."""
    if c.compile_target is None:
        return None

    t = get_target(c.compile_target)
    if t.family == CPU:
        return None
    if c.devices is not None:
        raise TargetError(
            f"--devices simulates CPU devices; with --target {t.name} the mesh alone sets the "
            f"device count: drop --devices"
        )
    if c.multiprocess.num_processes is not None or c.multiprocess.detect:
        raise TargetError(
            f"--target {t.name} compiles in one process for devices it does not have: drop "
            f"the multi-process options"
        )
    return t.name


def _run_audit_program(
    c: AuditConfig, json_path: str | None, console: Any, target: str | None
) -> int:
    shown = {"console": console, "by_scope": c.by_scope}
    if isinstance(c, AuditProgramConfig):
        return run_audit_program(
            c.program_ref,
            c.mesh,
            json_path,
            rules_path=c.rules,
            rule_set=c.rule_set,
            target=target,
            **shown,
        )
    if isinstance(c, AuditHloConfig):
        return run_audit_hlo(c.hlo, c.mesh, json_path, **shown)
    if isinstance(c, AuditReshardConfig):
        return run_audit_command("reshard", c.mesh, json_path, target=target, **shown)
    if isinstance(c, AuditMatmulConfig):
        return run_matmul_command(
            c.mesh_or_default,
            c.m,
            c.k,
            c.n,
            c.dtype,
            c.a_spec,
            c.b_spec,
            c.out_spec,
            json_path,
            hints=c.hints,
            target=target,
            **shown,
        )
    assert isinstance(c, AuditTransformerConfig)
    return run_transformer_command(
        c.strategy,
        c.mesh,
        c.layers,
        json_path,
        mode=c.mode,
        impl=c.impl,
        constraints=c.constraints,
        d_model=c.d_model,
        heads=c.heads,
        ff=c.ff,
        batch=c.batch,
        seq=c.seq,
        dtype=c.dtype,
        hints=c.hints,
        target=target,
        **shown,
    )


def _add_audit(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]

    audit = sub.add_parser(
        "audit",
        help="compile a program and list the collectives XLA inserted, against the minimum",
        description="Compile a program and list every collective XLA inserted, by mesh axis "
        "and kind, with counts (loop trips included), bytes and source lines; for the matmul "
        "and the transformer, compare with the minimum communication and verify better plans. "
        "Your own program: 'shardscope audit FILE.py:FUNCTION --mesh data=2,model=4'; a "
        "compiler's dump: 'shardscope audit --hlo FILE --mesh data=8'.",
    )
    programs = audit.add_subparsers(dest="program", metavar="PROGRAM", parser_class=_Parser)
    programs.required = True
    _add_audit_program(programs)
    _add_audit_hlo(programs)
    _add_audit_matmul(programs)
    _add_audit_reshard(programs)
    _add_audit_transformer(programs)


def _audit_options(
    p: argparse.ArgumentParser, config: type[AuditConfig], default_mesh: str | None
) -> None:
    """The options every audit takes, and what runs it."""
    p.add_argument(
        "--mesh",
        default=None,
        metavar="SPEC",
        help="mesh description, e.g. 'model=8' or 'data=2,model=4'"
        + (f" (default {default_mesh})" if default_mesh else ""),
    )
    p.add_argument(
        "--json", default=None, metavar="FILE", help="also write it as JSON ('-': stdout)"
    )
    p.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        metavar="N",
        help="simulated CPU devices, per process in a multi-process run (default: enough "
        "for the mesh, at least 8)",
    )
    p.add_argument(
        "--by-scope",
        action="store_true",
        help="one row per named scope or module path, axes and kind (with the pass and "
        "source lines) instead of one per collective",
    )
    add_distributed_options(p)
    p.set_defaults(
        config=config,
        default_mesh=default_mesh,
        compile_target=None,
    )


def _target_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        dest="compile_target",
        default=None,
        choices=list(TARGETS),
        metavar="TARGET",
        help="compile for this hardware with its own compiler, on devices it does not "
        f"need ({', '.join(TARGETS)}; default cpu: simulated CPU devices)",
    )


def _hints_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-hints",
        dest="hints",
        action="store_false",
        help="skip compiling the suggested better plans",
    )


def _add_audit_program(programs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    own = programs.add_parser(
        "program",
        help="your program: FILE.py:FUNCTION, a make_step(mesh) returning (jitted step, args) "
        "(shorthand: shardscope audit FILE.py:FUNCTION)",
        description="Load FILE.py, call FUNCTION(mesh) (or FUNCTION(mesh, rules)) for the mesh "
        "of --mesh, and audit the jitted step it returns on the arguments it returns.",
    )
    own.add_argument("program_ref", metavar="FILE.py:FUNCTION", help="the make_step function")
    own.add_argument(
        "--rules", metavar="FILE", help="logical-axis rules (JSON) in force while it runs"
    )
    own.add_argument(
        "--rule-set", metavar="NAME", help="which rule set of the file (when it has several)"
    )
    _audit_options(own, AuditProgramConfig, None)
    _target_option(own)


def _add_audit_hlo(programs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    hlo = programs.add_parser(
        "hlo",
        help="HLO text a compiler dumped (XLA_FLAGS=--xla_dump_to=DIR) "
        "(shorthand: shardscope audit --hlo FILE)",
        description="Audit optimized HLO text: a *after_optimizations.txt file of an XLA "
        "dump, or a dump folder holding exactly one.",
    )
    hlo.add_argument("--hlo", required=True, metavar="FILE", help="the HLO file or dump folder")
    _audit_options(hlo, AuditHloConfig, None)


def _add_audit_matmul(programs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    mm = programs.add_parser(
        "matmul",
        help="C[m,n] = A[m,k] @ B[k,n] with given specs (default: the taster's matmul)",
        description="Audit one sharded matmul and compare it with the best plan for its specs. "
        "A spec has one entry per dimension, comma-separated: None or a mesh axis name. The "
        "defaults are the taster's: a replicated [16,1024] activation times a [1024,1024] "
        "matrix sharded on rows over 'model'.",
    )
    _audit_options(mm, AuditMatmulConfig, "model=8")
    _target_option(mm)
    mm.add_argument("--m", type=positive_int, default=16, help="rows of A and C (default 16)")
    mm.add_argument("--k", type=positive_int, default=1024, help="contracted size (default 1024)")
    mm.add_argument(
        "--n", type=positive_int, default=1024, help="columns of B and C (default 1024)"
    )
    mm.add_argument("--dtype", default="float32", help="element type (default float32)")
    mm.add_argument(
        "--a-spec", default="None,None", metavar="S", help="A's spec (default None,None)"
    )
    mm.add_argument(
        "--b-spec", default="model,None", metavar="S", help="B's spec (default model,None)"
    )
    mm.add_argument(
        "--out-spec", default="None,None", metavar="S", help="C's spec (default None,None)"
    )
    _hints_option(mm)


def _add_audit_reshard(programs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    rs = programs.add_parser(
        "reshard",
        help="the taster's reshard: a [1024,1024] matrix from row to column shards inside jit",
    )
    _audit_options(rs, AuditReshardConfig, "model=8")
    _target_option(rs)


def _add_audit_transformer(programs: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tf = programs.add_parser(
        "transformer",
        help="the reference decoder under a sharding strategy, against its minimum",
        description="Audit the reference decoder (RMSNorm, causal attention, MLP) under a "
        "strategy and compare with the minimum communication for it, per axis and kind.",
    )
    _audit_options(tf, AuditTransformerConfig, None)
    _target_option(tf)
    tf.add_argument("--strategy", required=True, choices=list(STRATEGIES), help="the strategy")
    tf.add_argument("--layers", type=positive_int, default=None, help="decoder layers (default 2)")
    tf.add_argument("--mode", choices=["forward", "train"], default="forward")
    tf.add_argument(
        "--impl",
        choices=["jit", "shard_map"],
        default="jit",
        help="jit (the compiler inserts collectives) or shard_map (explicit ones)",
    )
    tf.add_argument(
        "--no-constraints",
        dest="constraints",
        action="store_false",
        help="drop the strategy's activation sharding constraints",
    )
    for flag in ("d-model", "heads", "ff", "batch", "seq"):
        tf.add_argument(f"--{flag}", type=positive_int, default=None, metavar="N")
    tf.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    _hints_option(tf)


def _check_plan(c: PlanConfig) -> None:
    """What ``plan`` can refuse before it compiles: strategy names and output files (the
    library refuses the rest of its input before compiling too)."""

    for name in c.strategies.split(",") if c.strategies is not None else []:
        if name.strip() not in STRATEGIES:
            raise PlanError(
                f"unknown strategy {name.strip()!r} in --strategies {c.strategies!r}; give "
                f"a comma-separated list of {', '.join(STRATEGIES)}"
            )
    check_output_paths({"--json": c.json, "--png": c.png, "--report": c.report})


def _cmd_plan(c: PlanConfig) -> int:

    if c.program is None and (c.rules or c.axes or c.meshes):
        raise UsageError(
            f"{PROG} plan: --rules, --axes and --meshes plan your own program; give "
            f"--program FILE.py:FUNCTION"
        )
    if c.program is not None:
        return _cmd_plan_program(c, c.program)
    return run_plan_command(
        model=c.model,
        devices=c.devices,
        dims=c.dims,
        batch=c.batch,
        seq=c.seq,
        mode=c.mode,
        hardware=c.hardware,
        hardware_overrides=c.hardware_overrides,
        strategies=[n.strip() for n in c.strategies.split(",")] if c.strategies else None,
        bytes_per_param=c.bytes_per_param,
        flash_attention=not c.no_flash_attention,
        remat=c.remat.split(",") if c.remat else None,
        microbatches=c.microbatches,
        stages=c.stages,
        compile_top=c.compile_top,
        workers=c.workers,
        json_path=c.json,
        png_path=c.png,
        report_path=c.report,
        top=c.top,
        compiler=c.compiler,
        target_plans=c.target_plans,
        flags=c.flags,
    )


def _cmd_plan_program(c: PlanConfig, program: str) -> int:

    model_flags = [f"--{k.replace('_', '-')}" for k, v in c.dims.items() if v is not None]
    model_flags += [
        flag
        for flag, value in (
            ("--model", c.model),
            ("--batch", c.batch),
            ("--seq", c.seq),
            ("--strategies", c.strategies),
        )
        if value is not None
    ]
    if model_flags:
        raise UsageError(
            f"{PROG} plan: {', '.join(model_flags)} describe the built-in model; with "
            f"--program your make_step builds the model (drop them)"
        )
    target = None if c.compiler in (None, "cpu") else c.compiler
    if target is not None and target != c.hardware:
        raise UsageError(
            f"{PROG} plan: --compiler {target} compiles for {target} but the estimates use "
            f"--hardware {c.hardware}; give --hardware {target}"
        )
    return run_plan_program(
        program,
        c.devices,
        target=target,
        rules_path=c.rules,
        axes=_names(c.axes, "--axes"),
        meshes=c.meshes.split(";") if c.meshes else None,
        hardware=c.hardware,
        hardware_overrides=c.hardware_overrides,
        json_path=c.json,
        png_path=c.png,
        report_path=c.report,
        top=c.top,
        flags=c.flags,
    )


def _names(text: str | None, flag: str) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",")]
    if not all(n.isidentifier() for n in names):
        raise UsageError(f"{PROG} plan: {flag} {text!r}: write axis names, e.g. data,model")
    return names


def _add_plan_parser(sub: Any) -> None:

    p = sub.add_parser(
        "plan",
        help="rank sharding strategies and mesh shapes for a model on N devices",
        description="Estimate every strategy, mesh shape, micro-batch count, recomputation "
        "and pipeline stage count for a model on N devices; compile the best on N simulated "
        "devices (nothing allocated), audit their collectives, and rank the plans by the "
        "step time of a calibrated time model on a hardware preset.",
    )
    _plan_what_options(p)
    _plan_shape_options(p)
    _plan_hardware_options(p)
    _plan_search_options(p)
    _plan_compile_options(p)
    _plan_output_options(p)
    p.set_defaults(config=PlanConfig)


def _plan_what_options(p: argparse.ArgumentParser) -> None:
    """What to plan: a built-in model, or the user's program and its rules and meshes."""
    p.add_argument(
        "--model",
        metavar="NAME|FILE",
        help=f"a model preset ({', '.join(MODEL_PRESETS)}; 7b, 13b, 70b are the Llama 2 "
        f"ones) or the path of a Llama-family config.json",
    )
    p.add_argument(
        "--program",
        metavar="FILE.py:FUNCTION",
        help="plan your own program: FUNCTION(mesh) (or FUNCTION(mesh, rules)) returns the "
        "jitted step and its arguments",
    )
    p.add_argument(
        "--rules",
        metavar="FILE",
        help='candidate logical-axis rule sets, JSON: {"axes": [...], "rules": {name: '
        "[[logical, mesh axes], ...]}} (default: the program's RULES, if it has one)",
    )
    p.add_argument("--axes", metavar="LIST", help="mesh axis names, e.g. data,model")
    p.add_argument(
        "--meshes",
        metavar="LIST",
        help="mesh shapes to try, ';'-separated, e.g. 'data=4,model=2;data=8,model=1' "
        "(default: every way to spread the devices over the axes)",
    )


def _plan_shape_options(p: argparse.ArgumentParser) -> None:
    """The model's shape, the devices and the batch."""
    for dim in ("d-model", "heads", "ff", "layers", "vocab"):
        p.add_argument(
            f"--{dim}", type=positive_int, metavar="N", help="model shape (overrides the preset's)"
        )
    p.add_argument(
        "--devices", type=positive_int, required=True, metavar="N", help="accelerators to plan for"
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        metavar="N",
        help="global batch in sequences (default: one per device)",
    )
    p.add_argument("--seq", type=positive_int, metavar="N", help="sequence length")
    p.add_argument("--mode", choices=["train", "forward"], default="train")


def _plan_hardware_options(p: argparse.ArgumentParser) -> None:
    """The hardware preset and the settings that override it."""
    p.add_argument(
        "--hardware", default="h100", choices=list(PRESETS), help="hardware preset (default h100)"
    )
    for flag, dest, what in (
        ("--link-bandwidth", "link_bandwidth", "bytes/s per device within a node"),
        ("--cross-node-bandwidth", "cross_node_bandwidth", "bytes/s per device across nodes"),
        ("--latency", "latency_s", "seconds per collective step"),
        ("--memory", "memory_bytes", "device memory in bytes"),
        ("--peak-flops", "peak_flops", "FLOP/s per device"),
        ("--hbm-bandwidth", "hbm_bandwidth", "bytes/s between a device and its memory"),
        ("--matmul-fraction", "matmul_fraction", "fraction of peak the matmuls reach"),
        ("--comm-fraction", "comm_fraction", "achieved fraction of the link bandwidth"),
    ):
        p.add_argument(flag, dest=dest, type=positive_number, metavar="X", help=what)
    p.add_argument(
        "--node-size", type=positive_int, metavar="N", help="devices per node with the fast links"
    )


def _plan_search_options(p: argparse.ArgumentParser) -> None:
    """Which strategies, recomputations, micro-batches and stages to try."""
    p.add_argument(
        "--strategies",
        metavar="LIST",
        help="comma-separated strategies to try (default: dp,fsdp,zero1,zero2,tp,sp,dp_tp,"
        "zero1_tp,fsdp_tp,dp_sp)",
    )
    p.add_argument(
        "--remat",
        metavar="LIST",
        help="activation recomputation to try, comma-separated: none, selective, full "
        "(default: all)",
    )
    p.add_argument(
        "--microbatches",
        type=positive_int,
        metavar="N",
        help="micro-batches per data shard (default: try the divisors)",
    )
    p.add_argument(
        "--stages",
        type=positive_int,
        metavar="N",
        help="pipeline stages (default: try 1 and the divisors of the layers up to 16)",
    )
    p.add_argument(
        "--compile-top",
        type=positive_int,
        default=3,
        metavar="N",
        help="compile the best estimated plans of the N best strategy-and-mesh pairs (and "
        "the best of dp, fsdp and tp, whose communication is validated; default 3)",
    )
    p.add_argument(
        "--bytes-per-param",
        type=positive_int,
        default=16,
        metavar="N",
        help="training model state per parameter (default 16: mixed-precision Adam)",
    )
    p.add_argument(
        "--no-flash-attention",
        action="store_true",
        help="materialise the attention scores (dense attention) in the compiled program and "
        "count them in the estimate",
    )


def _plan_compile_options(p: argparse.ArgumentParser) -> None:
    """How the leading plans are compiled."""
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="compile in N worker processes (0: in this process; default: auto)",
    )
    p.add_argument(
        "--compiler",
        default=None,
        choices=["cpu", *PRESETS],
        help="cpu: every plan compiled by the CPU backend (fastest); default: the hardware's "
        "own compiler (deviceless) compiles the leading plans after a CPU screening. With "
        "--program: every candidate is compiled by this compiler (default cpu)",
    )
    p.add_argument(
        "--target-plans",
        type=positive_int,
        default=3,
        metavar="N",
        help="how many leading plans the hardware's compiler compiles (default 3)",
    )


def _plan_output_options(p: argparse.ArgumentParser) -> None:
    """What is shown and written."""
    p.add_argument("--top", type=positive_int, metavar="N", help="show only the best N")
    p.add_argument("--json", metavar="FILE", help="write the plans as JSON ('-': stdout)")
    p.add_argument("--png", metavar="FILE", help="write the memory vs communication chart")
    p.add_argument("--report", metavar="FILE", help="write a Markdown report")


def _version_text() -> str:

    h = result_header(None)
    return (
        f"{PROG} {h['shardscope_version']} (jax {h['jax_version']}, jaxlib {h['jaxlib_version']})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Show, check and plan how JAX shards arrays and what communication XLA "
        "inserts.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    lab = sub.add_parser(
        "lab",
        help="run the sharding taster lab: every claim a named check, JSON scorecard + PNG",
        description="Simulate devices, shard a parameter, check a sharded matmul against one "
        "device, reshard, plot per-device memory; writes <out>/sharding_taster.json and a PNG. "
        "Exit 0 when every check passes, 1 when any fails.",
    )
    lab.add_argument(
        "--devices",
        type=positive_int,
        default=None,
        metavar="N",
        help="simulated CPU devices, per process in a multi-process run (default: XLA_FLAGS' "
        "count if set, else 8)",
    )
    lab.add_argument(
        "--out", default="scores", metavar="DIR", help="result folder (default: scores)"
    )
    add_distributed_options(lab)
    lab.set_defaults(config=LabConfig)

    _add_audit(sub)
    _add_diff(sub)
    _add_launch(sub)
    _add_plan_parser(sub)
    return parser


# -- shardscope diff -----------------------------------------------------------------------------


def _add_diff(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]

    diff = sub.add_parser(
        "diff",
        help="compare two audits (--json files): collectives that appeared, disappeared or "
        "changed, per axis and kind; exit 1 when a budget is broken",
        description="Compare two audit JSON files written by 'shardscope audit ... --json': "
        "list the collectives that appeared, disappeared or changed count or bytes per mesh "
        "axis and kind. Exit 0 within budget, 1 when a budget is broken, 2 on bad input.",
    )
    diff.add_argument("old", metavar="OLD.json")
    diff.add_argument("new", metavar="NEW.json")
    diff.add_argument(
        "--max-bytes-increase",
        metavar="SIZE",
        help="most the bytes each device sends may grow: bytes, a size (64MiB) or a percentage "
        "of the old total (5%%)",
    )
    diff.add_argument(
        "--no-new",
        action="append",
        default=[],
        choices=list(KINDS),
        metavar="KIND",
        help="a collective kind whose count must not grow (repeatable), e.g. all-gather",
    )
    diff.add_argument(
        "--by-scope",
        action="store_true",
        help="one row per named scope or module path, axes and kind (the audits' by_scope "
        "totals) instead of one per axes and kind",
    )
    diff.add_argument("--json", metavar="FILE", help="also write the diff as JSON ('-': stdout)")
    diff.set_defaults(config=DiffConfig)


def _check_diff(c: DiffConfig) -> None:

    check_output_paths({"--json": c.json}, {"OLD.json": c.old, "NEW.json": c.new})


def _cmd_diff(c: DiffConfig) -> int:

    return run_diff(
        c.old,
        c.new,
        max_bytes_increase=c.max_bytes_increase,
        no_new=c.no_new,
        json_path=c.json,
        by_scope=c.by_scope,
    )


def _route_audit(argv: list[str]) -> list[str]:
    """``audit FILE.py:FUNCTION ...`` and ``audit --hlo FILE ...``: the shorthands of
    ``audit program FILE.py:FUNCTION`` and ``audit hlo --hlo FILE``."""
    if argv[:1] != ["audit"] or len(argv) < 2:
        return argv
    rest = argv[1:]
    if rest[0] in ("program", "hlo", "matmul", "reshard", "transformer"):
        return argv
    if "--hlo" in rest or any(a.startswith("--hlo=") for a in rest):
        return ["audit", "hlo", *rest]
    if ".py:" in rest[0] or rest[0].endswith(".py"):
        return ["audit", "program", *rest]
    return argv


# -- shardscope launch --------------------------------------------------------------------------


def _add_launch(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    launch = sub.add_parser(
        "launch",
        help="run a sub-command as P local processes of one multi-process JAX run",
        description="Start P processes of 'shardscope SUB-COMMAND ...' on this machine, joined "
        "in one JAX run over a free loopback port (each gets --coordinator, --num-processes, "
        "--process-id and --devices), with every output line prefixed by '[i] '. If one "
        "process dies, the others are ended at once and the launcher names it. For local "
        "testing of multi-process code; on a cluster use srun/mpirun and --distributed.",
    )
    launch.add_argument(
        "-n",
        "--num-processes",
        type=positive_int,
        required=True,
        metavar="P",
        help="processes to start",
    )
    launch.add_argument(
        "--devices-per-process",
        type=positive_int,
        default=4,
        metavar="D",
        help="simulated CPU devices in each process (default: 4)",
    )
    launch.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="end the whole run after S seconds (exit 124)",
    )
    launch.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        metavar="-- SUB-COMMAND ...",
        help="the shardscope sub-command each process runs, after '--'",
    )
    launch.set_defaults(config=LaunchConfig)


def _cmd_launch(c: LaunchConfig) -> int:

    command = c.sub_command
    try:
        check_launch_command(command)
        check_launch_size(c.num_processes, c.devices_per_process)
    except ShardscopeError as e:
        raise UsageError(f"{PROG} launch: {e}{c.flags(e.params)}") from None
    # A bad sub-command is reported once, here, rather than by every process.
    try:
        build_parser().parse_args(_route_audit(command))
    except UsageError as e:
        raise UsageError(f"{PROG} launch: {e}") from None
    # What each process will be given, with the values it will be given.
    probe = [*_route_audit(command)]  # a copy: the command itself goes to every process
    probe += ["--coordinator", "127.0.0.1:1", "--num-processes", str(c.num_processes)]
    probe += ["--process-id", "0", "--devices", str(c.devices_per_process)]
    try:
        sub = command_config(build_parser().parse_args(probe))
    except UsageError:
        raise UsageError(
            f"{PROG} launch: '{command[0]}' cannot run as several processes (it takes no "
            f"--coordinator, --num-processes, --process-id and --devices options)"
        ) from None
    try:  # the sub-command's own checks, here, before any process starts
        _check(sub)
    except ShardscopeError as e:
        where = " ".join(command[:2])
        raise UsageError(f"{PROG} launch: {where}: {e}{sub.flags(e.params)}") from None
    result = launch(
        command,
        c.num_processes,
        devices_per_process=c.devices_per_process,
        timeout_s=c.timeout,
    )
    if result.exit_code:
        print(f"{PROG} launch: {result.message}", file=sys.stderr)
    return result.exit_code


#: What runs each command, and what refuses its bad input before any work (None: nothing).
_HANDLERS: dict[type[Any], tuple[Callable[[Any], int], Callable[[Any], None] | None]] = {
    LabConfig: (_cmd_lab, _check_lab),
    AuditProgramConfig: (_cmd_audit, _check_audit),
    AuditHloConfig: (_cmd_audit, _check_audit),
    AuditMatmulConfig: (_cmd_audit, _check_audit),
    AuditReshardConfig: (_cmd_audit, _check_audit),
    AuditTransformerConfig: (_cmd_audit, _check_audit),
    DiffConfig: (_cmd_diff, _check_diff),
    LaunchConfig: (_cmd_launch, None),
    PlanConfig: (_cmd_plan, _check_plan),
}


def main(argv: Sequence[str] | None = None) -> int:

    die_with_launcher()
    with leave_run_on_failure():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    # --debug may stand anywhere before a "--" (after it, the words belong to a sub-command).
    end = args_list.index("--") if "--" in args_list else len(args_list)
    debug = "--debug" in args_list[:end]
    args_list = [a for a in args_list[:end] if a != "--debug"] + args_list[end:]
    args_list = _route_audit(args_list)
    parser = build_parser()
    flags = NO_FLAGS  # the flags that set the parameters a library error names
    try:
        args = parser.parse_args(args_list)
        if args.command is None:  # pragma: no cover - argparse enforces it
            parser.error("a command is required")
        config = command_config(args)
        flags = config.flags
        # JAX and its accelerator plugins, without their start-up chatter; no backend starts
        # here, and some checks below read JAX's dtypes.
        start_jax()
        _check(config)  # bad input is refused before any work
        return _HANDLERS[type(config)][0](config)
    except UsageError as e:
        _fail(str(e))
    except ShardscopeError as e:
        if debug:
            raise
        _fail(f"{PROG}: error: {e}{flags(e.params)}")
    except DeviceSetupError as e:
        if debug:
            raise
        _fail(f"{PROG}: error: {e}{flags(e.params)}")
    except OSError as e:  # a file we were asked to write or read; the message names it
        if debug:
            raise
        _fail(f"{PROG}: error: {e}")
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    return 0


def command_config(args: argparse.Namespace) -> CommandConfig:
    """The typed record of what the parsed command line asks for."""
    config: type[CommandConfig] = args.config
    return config.from_args(args)


def _check(config: CommandConfig) -> None:
    """Runs the sub-command's checks of its input, if it has any."""
    check = _HANDLERS[type(config)][1]
    if check is not None:
        check(config)


def _fail(message: str) -> NoReturn:
    print(_shorten(" ".join(message.split())), file=sys.stderr)
    raise SystemExit(2)


def _shorten(line: str, longest: int = 80) -> str:
    """``line`` with any word longer than ``longest`` characters cut to its ends: a value
    thousands of characters long is named, not echoed whole."""

    def cut(m: re.Match[str]) -> str:
        word = m.group()
        return f"{word[:40]}...{word[-20:]} ({len(word):,} characters)"

    return re.sub(rf"\S{{{longest + 1},}}", cut, line)
