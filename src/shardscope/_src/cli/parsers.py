"""The command line's grammar: every command's parser and options, in one place.

Building the parser imports no command's implementation: ``shardscope lab`` loads the lab and
what it uses, not the planner (cli/main.py imports a command's module when it runs it).
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from shardscope._src.base.comm import KINDS
from shardscope._src.base.records import result_header
from shardscope._src.cli.args import (
    PROG,
    Parser,
    add_axis_types_option,
    choice_reader,
    collective_kind,
    nonnegative_int,
    nonnegative_number,
    positive_bytes,
    positive_float,
    positive_int,
    positive_number,
    strategy_name,
)
from shardscope._src.cli.config import (
    AuditConfig,
    AuditHloConfig,
    AuditMatmulConfig,
    AuditMoEConfig,
    AuditProgramConfig,
    AuditReshardConfig,
    AuditTransformerConfig,
    DiffConfig,
    LabConfig,
    LaunchConfig,
    PlanConfig,
    ProfileConfig,
    ServeConfig,
    ShardConfig,
)
from shardscope._src.cli.distributed import add_distributed_options
from shardscope._src.cli.options import add_request_options, add_verbose_option
from shardscope._src.model.config import MODES, Mode
from shardscope._src.model.presets import DENSE_PRESETS, MOE_PRESETS
from shardscope._src.plan.request import (
    DEFAULT_REQUEST,
    PlanRequest,
    ProgramRequest,
    ServeRequest,
    SuggestRequest,
)
from shardscope._src.targets.hardware import PRESETS
from shardscope._src.targets.specs import TARGETS


def _version_text() -> str:

    h = result_header(None)
    return (
        f"{PROG} {h['shardscope_version']} (jax {h['jax_version']}, jaxlib {h['jaxlib_version']})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=PROG,
        description="Show, check and plan how JAX shards arrays and what communication XLA "
        "inserts.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=_version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True

    add_lab_parser(sub)
    add_audit_parser(sub)
    add_diff_parser(sub)
    _add_launch_parser(sub)
    add_plan_parser(sub)
    add_profile_parser(sub)
    add_serve_parser(sub)
    add_shard_parser(sub)
    return parser


def _add_launch_parser(sub: argparse._SubParsersAction) -> None:
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


def add_lab_parser(sub: argparse._SubParsersAction) -> None:
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


def add_audit_parser(sub: argparse._SubParsersAction) -> None:

    audit = sub.add_parser(
        "audit",
        help="compile a program and list the collectives XLA inserted, against the minimum",
        description="Compile a program and list every collective XLA inserted, by mesh axis "
        "and kind, with counts (loop trips included), bytes and source lines; for the matmul "
        "and the transformer, compare with the minimum communication and compile the changes "
        "it suggests. "
        "Your own program: 'shardscope audit FILE.py:FUNCTION --mesh data=2,model=4'; a "
        "compiler's dump: 'shardscope audit --hlo FILE --mesh data=8'.",
    )
    programs = audit.add_subparsers(dest="program", metavar="PROGRAM", parser_class=Parser)
    programs.required = True
    _add_audit_program(programs)
    _add_audit_hlo(programs)
    _add_audit_matmul(programs)
    _add_audit_moe(programs)
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
    add_verbose_option(p)
    add_distributed_options(p)
    p.set_defaults(
        config=config,
        default_mesh=default_mesh,
        compile_target=None,
    )


def _target_option(
    p: argparse.ArgumentParser,
    what: str = "compile for this hardware with its own compiler, on devices it does not need",
    default: str = "; default cpu: simulated CPU devices",
) -> None:
    """``--compiler`` (as ``plan``, ``shard`` and ``serve`` name it; ``--target`` is the same
    option): ``what`` it does, then the targets (and ``default``)."""
    p.add_argument(
        "--compiler",
        "--target",
        dest="compile_target",
        default=None,
        choices=list(TARGETS),
        metavar="TARGET",
        help=f"{what} ({', '.join(TARGETS)}{default})",
    )


def _hints_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--no-hints",
        dest="hints",
        action="store_false",
        help="skip compiling the changes it suggests (the hints)",
    )


def _add_audit_program(programs: argparse._SubParsersAction) -> None:
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
    add_axis_types_option(own)
    _audit_options(own, AuditProgramConfig, None)
    _target_option(own)


def _add_audit_hlo(programs: argparse._SubParsersAction) -> None:
    hlo = programs.add_parser(
        "hlo",
        help="HLO text a compiler dumped (XLA_FLAGS=--xla_dump_to=DIR) "
        "(shorthand: shardscope audit --hlo FILE)",
        description="Audit optimized HLO text: the ...after_optimizations.txt file of an XLA "
        "dump, or a dump folder holding exactly one.",
    )
    hlo.add_argument("--hlo", required=True, metavar="FILE", help="the HLO file or dump folder")
    _audit_options(hlo, AuditHloConfig, None)


def _add_audit_matmul(programs: argparse._SubParsersAction) -> None:
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


def _add_audit_moe(programs: argparse._SubParsersAction) -> None:
    moe = programs.add_parser(
        "moe",
        help="one expert-parallel mixture-of-experts layer: its dispatch and combine "
        "all-to-alls against the least a top-k routing needs",
        description="Audit one mixture-of-experts layer (a router, top-k routing, SwiGLU "
        "experts, capacity-padded dispatch) with its tokens and experts split over the mesh "
        "axis 'expert', and compare it with the least communication of top-k routing: each "
        "token's activations to its experts' devices and back (and their gradients, and the "
        "router's, with --mode train).",
    )
    _audit_options(moe, AuditMoEConfig, "expert=8")
    _target_option(moe)
    moe.add_argument("--tokens", type=positive_int, default=4096, help="tokens (default 4096)")
    moe.add_argument("--d-model", type=positive_int, default=256, help="width (default 256)")
    moe.add_argument(
        "--ff", type=positive_int, default=512, help="each expert's MLP width (default 512)"
    )
    moe.add_argument("--experts", type=positive_int, default=8, help="experts (default 8)")
    moe.add_argument("--top-k", type=positive_int, default=2, help="experts per token (default 2)")
    moe.add_argument(
        "--capacity-factor",
        type=float,
        default=1.0,
        metavar="X",
        help="each expert's slots over its even share of the tokens (default 1.0)",
    )
    moe.add_argument("--dtype", default="bfloat16", help="bfloat16 (default), float32, float16")
    moe.add_argument("--mode", choices=list(MODES), default=Mode.FORWARD)
    moe.add_argument(
        "--impl",
        choices=("jit", "shard_map"),
        default="jit",
        help="jit (the compiler inserts the all-to-alls) or shard_map (explicit ones)",
    )
    moe.add_argument(
        "--dispatch-once",
        action="store_true",
        help="send each token once to each device holding any of its experts and sum its "
        "outputs there (DeepEP's), not once per expert",
    )
    moe.add_argument(
        "--weight-activations",
        action="store_true",
        help="send each slot's router weight with it to its expert, which scales its "
        "activation by it (Megatron-Core's all-to-all dispatcher), not its output in the combine",
    )


def _add_audit_reshard(programs: argparse._SubParsersAction) -> None:
    rs = programs.add_parser(
        "reshard",
        help="the taster's reshard: a [1024,1024] matrix from row to column shards inside jit",
    )
    _audit_options(rs, AuditReshardConfig, "model=8")
    _target_option(rs)


def _add_audit_transformer(programs: argparse._SubParsersAction) -> None:
    tf = programs.add_parser(
        "transformer",
        help="the reference decoder under a sharding strategy, against its minimum",
        description="Audit the reference decoder (RMSNorm, causal attention, MLP) under a "
        "strategy and compare with the minimum communication for it, per axis and kind.",
    )
    _audit_options(tf, AuditTransformerConfig, None)
    _target_option(tf)
    tf.add_argument(
        "--strategy",
        required=True,
        type=strategy_name,
        help="the strategy: a preset (dp_tp, fsdp_sp, ...) or a composition of the dimensions "
        "named by their parts (zero1_sp_cp_ring, zero1_ep_tp, ...)",
    )
    tf.add_argument("--layers", type=positive_int, default=None, help="decoder layers (default 2)")
    tf.add_argument("--mode", choices=list(MODES), default=Mode.FORWARD)
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


def add_diff_parser(sub: argparse._SubParsersAction) -> None:

    diff = sub.add_parser(
        "diff",
        help="compare two audits (--json files): collectives that appeared, disappeared or "
        "changed, per axis and kind; exit 1 when a budget is broken",
        description="Compare two audit JSON files written by 'shardscope audit ... --json': "
        "list the collectives that appeared, disappeared or changed count or bytes per mesh "
        "axis and kind. Exit 0 within budget, 1 when a budget is broken, 2 on bad input. "
        "Without --max-bytes-increase or --no-new there is no budget: it only reports, and "
        "exits 0 whatever changed. It warns when the two audits are of different meshes or "
        "targets.",
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
        type=collective_kind,
        metavar="KIND",
        help="a collective kind whose count must not grow (repeatable): "
        f"{', '.join(KINDS)}, or with underscores (all_gather)",
    )
    diff.add_argument(
        "--by-scope",
        action="store_true",
        help="one row per named scope or module path, axes and kind (the audits' by_scope "
        "totals) instead of one per axes and kind",
    )
    diff.add_argument("--json", metavar="FILE", help="also write the diff as JSON ('-': stdout)")
    diff.set_defaults(config=DiffConfig)


def add_profile_parser(sub: argparse._SubParsersAction) -> None:
    prof = sub.add_parser(
        "profile",
        help="run your step under JAX's profiler and set each collective's measured time "
        "beside the audit's prediction (or join a trace taken elsewhere: --trace DIR)",
        description="Load FILE.py, call FUNCTION(mesh) for the mesh of --mesh, run the jitted "
        "step it returns on the devices this machine has (after --warmup runs), trace --steps "
        "runs with jax.profiler and join every collective of the trace to the audit's record "
        "of it: measured time and exposed time beside predicted, per collective, per scope "
        "and per step. With --trace DIR, read a trace taken elsewhere and join it to --audit "
        "FILE (written by 'shardscope audit --json') or to FILE.py:FUNCTION compiled for "
        "--compiler.",
    )
    prof.add_argument(
        "program_ref",
        nargs="?",
        default=None,
        metavar="FILE.py:FUNCTION",
        help="the make_step function (not needed with --trace and --audit)",
    )
    prof.add_argument("--mesh", default=None, metavar="SPEC", help="mesh, e.g. 'data=8'")
    prof.add_argument(
        "--trace", default=None, metavar="DIR", help="join this trace instead of taking one"
    )
    prof.add_argument(
        "--audit", default=None, metavar="FILE", help="with --trace: the audit (JSON) to join"
    )
    _target_option(
        prof,
        "with --trace and FILE.py:FUNCTION: compile it for this target, the devices the trace "
        "ran on",
        default="",
    )
    prof.add_argument(
        "--steps", type=positive_int, default=3, metavar="N", help="runs to trace (default 3)"
    )
    prof.add_argument(
        "--warmup",
        type=nonnegative_int,
        default=1,
        metavar="N",
        help="runs before the trace (default 1)",
    )
    prof.add_argument(
        "--hardware",
        default=None,
        choices=list(PRESETS),
        type=choice_reader(PRESETS),
        metavar="NAME",
        help="price the predictions on this preset (default: the devices' own; none on CPU: "
        f"{', '.join(PRESETS)})",
    )
    prof.add_argument("--trace-dir", default=None, metavar="DIR", help="keep the trace here")
    prof.add_argument("--json", default=None, metavar="FILE", help="write it as JSON ('-': stdout)")
    prof.add_argument("--png", default=None, metavar="FILE", help="draw one step's timeline")
    prof.add_argument(
        "--by-scope",
        action="store_true",
        help="one row per scope, axes and kind (per step) instead of one per collective",
    )
    prof.add_argument("--rules", metavar="FILE", help="logical-axis rules (JSON) in force")
    prof.add_argument("--rule-set", metavar="NAME", help="which rule set of the file")
    add_axis_types_option(prof)
    prof.set_defaults(config=ProfileConfig)


def add_plan_parser(sub: Any) -> None:
    """``shardscope plan``. An option of a knob of :class:`PlanRequest` keeps no default of its
    own: not given, it is None and the request's default applies (the help reads it there)."""

    p = sub.add_parser(
        "plan",
        help="rank sharding strategies and mesh shapes for a model on N devices",
        description="Estimate every strategy, mesh shape, micro-batch count, recomputation "
        "and pipeline stage count for a model on N devices; compile the best on N simulated "
        "devices (nothing allocated), audit their collectives, and rank the plans by the "
        "step time of a calibrated time model on a hardware preset.",
    )
    _plan_what_options(p)
    # --model is the what-options' own: without it the command line plans a model given by
    # its shape, where the library's default is a preset
    add_request_options(p, PlanRequest, skip=("model",), required=("devices",))
    _hardware_settings_options(p)
    _output_options(
        p,
        chart="the chart of step time against the memory that decided the fit",
        top="show only the best N (with --serve: the best N and every plan of the "
        "latency-throughput front)",
    )
    _plan_serve_options(p)
    p.set_defaults(config=PlanConfig)


def _plan_serve_options(p: argparse.ArgumentParser) -> None:
    """``--serve``: serving plans, as ``shardscope serve`` makes them; the options that plan
    also reads for training (the model, the devices, the hardware, the batch, ...) are its."""
    g = p.add_argument_group("serving (--serve; also the command shardscope serve)")
    g.add_argument(
        "--serve",
        action="store_true",
        help="plan serving: every tensor-parallel layout (and, for a mixture of experts, "
        "expert-parallel one) and batch that fits, with the time per output token, the time "
        "to first token and the throughput per chip",
    )
    shared = {f.name for f in fields(PlanRequest)} | {"hardware_overrides"}
    add_request_options(g, ServeRequest, skip=shared, suffix=" (--serve)")


def add_serve_parser(sub: Any) -> None:
    """``shardscope serve``: every knob of :class:`ServeRequest`, the hardware's settings and
    what is shown and written."""
    p = sub.add_parser(
        "serve",
        help="plan serving a model on N devices: layouts, batches, latencies",
        description="Estimate every tensor-parallel layout (and, for a mixture of experts, "
        "expert-parallel one) and batch that fits a model's weights and KV cache on N "
        "devices; compile the best of each with the hardware's own compiler (deviceless) "
        "and rank them by the time per output token, with the time to first token and the "
        "throughput per chip.",
    )
    add_request_options(
        p,
        ServeRequest,
        skip=("hardware_overrides",),
        required=("model", "devices", "prompt", "output"),
    )
    _hardware_settings_options(p)
    _output_options(
        p,
        chart="the chart of time per output token against throughput per chip",
        report=False,
        top="show the best N and every plan of the latency-throughput front (default 12)",
    )
    p.set_defaults(config=ServeConfig)


def _plan_what_options(p: argparse.ArgumentParser) -> None:
    """What to plan: a built-in model, or the user's program and its rules and meshes."""
    p.add_argument(
        "--model",
        metavar="NAME|FILE",
        help=f"a model preset ({', '.join(DENSE_PRESETS)}; 7b, 13b, 70b are the Llama 2 "
        f"ones; the mixtures of experts {', '.join(MOE_PRESETS)}) or the path of a Hugging "
        f"Face config.json or of a model's folder holding one (Llama-family, Mixtral, "
        f"Qwen3-MoE, DeepSeek-V3)",
    )
    p.add_argument(
        "--program",
        metavar="FILE.py:FUNCTION",
        help="plan your own program: FUNCTION(mesh) (or FUNCTION(mesh, rules)) returns the "
        "jitted step and its arguments",
    )
    add_request_options(p, ProgramRequest, skip=("axis_types",))
    add_axis_types_option(p)


def _plan_hardware_options(p: argparse.ArgumentParser, what: str = "") -> None:
    """The hardware preset and the settings that override it."""
    p.add_argument(
        "--hardware",
        choices=list(PRESETS),
        type=choice_reader(PRESETS),
        help=f"hardware preset{what} (default {DEFAULT_REQUEST.hardware})",
    )
    _hardware_settings_options(p)


def _hardware_settings_options(p: argparse.ArgumentParser) -> None:
    """The settings that override the hardware preset's."""
    for flag, dest, help_text in (
        ("--link-bandwidth", "link_bandwidth", "bytes/s per device within a node"),
        ("--cross-node-bandwidth", "cross_node_bandwidth", "bytes/s per device across nodes"),
        ("--latency", "latency_s", "seconds per collective step"),
        ("--memory", "memory_bytes", "device memory: bytes, or a size (80GB, 79.1GiB)"),
        ("--peak-flops", "peak_flops", "FLOP/s per device"),
        ("--hbm-bandwidth", "hbm_bandwidth", "bytes/s between a device and its memory"),
        (
            "--hbm-fraction",
            "hbm_fraction",
            "fraction of the HBM bandwidth matmuls reach reading their operands",
        ),
        ("--matmul-fraction", "matmul_fraction", "fraction of peak the matmuls reach"),
        ("--comm-fraction", "comm_fraction", "achieved fraction of the link bandwidth"),
        ("--fp8-peak-flops", "fp8_peak_flops", "fp8 FLOP/s per device (--matmul-dtype fp8)"),
        (
            "--fp8-matmul-fraction",
            "fp8_matmul_fraction",
            "fraction of the fp8 peak the fp8 matmuls reach",
        ),
        (
            "--tf32-peak-flops",
            "tf32_peak_flops",
            "TF32 FLOP/s per device: a GPU's rate for a program's f32 matmuls at JAX's "
            "default precision",
        ),
        (
            "--fp32-peak-flops",
            "fp32_peak_flops",
            "fp32 FLOP/s per device: a GPU's rate for f32 matmuls at precision highest",
        ),
        (
            "--attention-fwd-flops",
            "attention_fwd_flops",
            "FLOP/s of a fused causal attention kernel's forward (FlashAttention's count; "
            "with --attention-bwd-flops; an H100's cuDNN: 518e12)",
        ),
        (
            "--attention-bwd-flops",
            "attention_bwd_flops",
            "FLOP/s of its backward (an H100's cuDNN: 499e12)",
        ),
        (
            "--kernel-launch",
            "kernel_launch_s",
            "seconds a compiled serving step pays per kernel it launches (0: none)",
        ),
        (
            "--kernel-floor",
            "kernel_floor_s",
            "the least seconds a GPU kernel takes, however little its work (0: none)",
        ),
    ):
        kind = {
            "memory_bytes": positive_bytes,
            "kernel_launch_s": nonnegative_number,
            "kernel_floor_s": nonnegative_number,
        }.get(dest, positive_number)
        p.add_argument(flag, dest=dest, type=kind, metavar="X", help=help_text)
    p.add_argument(
        "--node-size", type=positive_int, metavar="N", help="devices per node with the fast links"
    )
    for flag, dest, help_text in (
        ("--sms", "sms", "a GPU's multiprocessors, over which a matmul's tiles run in waves"),
        ("--tile-m", "tile_m", "rows of the output tile a multiprocessor computes of a matmul"),
        ("--tile-n", "tile_n", "columns of that tile"),
    ):
        p.add_argument(flag, dest=dest, type=positive_int, metavar="N", help=help_text)
    p.add_argument(
        "--exchange-sms",
        dest="exchange_sms",
        type=nonnegative_int,
        metavar="N",
        help="multiprocessors a mixture's all-to-alls hold while they run beside compute, as "
        "DeepEP's or HybridEP's configured count (Megatron's moe_hybridep_num_sms; default 0: "
        "NCCL's channels, as the other collectives)",
    )
    p.add_argument(
        "--tp-overlap",
        dest="tp_overlap",
        action=argparse.BooleanOptionalAction,
        help="tensor-parallel collectives run beside the matmuls they feed, as Transformer "
        "Engine's ub_tp_comm_overlap and XLA's collective matmuls run them (default: a "
        "TPU's compiler does, a GPU's program does not)",
    )
    p.add_argument(
        "--pp-overlap",
        dest="pp_overlap",
        action=argparse.BooleanOptionalAction,
        help="pipeline stages send and receive beside the steady 1F1B phase's compute, as "
        "Megatron's overlap_p2p_comm does; only the fill's and flush's transfers wait "
        "(default: off)",
    )
    p.add_argument(
        "--ep-overlap",
        dest="ep_overlap",
        action=argparse.BooleanOptionalAction,
        help="a mixture's expert all-to-alls run beside another micro-batch's compute, as "
        "Megatron's combined 1F1B schedule (--overlap-moe-expert-parallel-comm) runs them; "
        "only the chunks that run alone wait for theirs (default: off)",
    )
    p.add_argument(
        "--fsdp-overlap",
        dest="fsdp_overlap",
        action=argparse.BooleanOptionalAction,
        help="FSDP's weight gathers and gradient reduce-scatters run beside compute, as "
        "frameworks prefetch them (default: on); --no-fsdp-overlap puts them on the critical "
        "path, as XLA's GPU compiler schedules a scanned layer's without its "
        "pipelined-collective flags",
    )


def _output_options(
    p: argparse.ArgumentParser,
    *,
    chart: str,
    report: bool = True,
    top: str = "show only the best N",
) -> None:
    """What a planning command shows and writes: ``--png`` draws ``chart``; ``top`` is what
    ``--top`` shows."""
    p.add_argument("--top", type=positive_int, metavar="N", help=top)
    p.add_argument("--json", metavar="FILE", help="write the plans as JSON ('-': stdout)")
    p.add_argument("--png", metavar="FILE", help=f"write {chart}")
    if report:
        p.add_argument("--report", metavar="FILE", help="write a Markdown report")
    add_verbose_option(p)


def add_shard_parser(sub: Any) -> None:
    """``shardscope shard``: propose the sharding of the user's program."""
    p = sub.add_parser(
        "shard",
        aliases=["suggest"],  # the library's name for it: shardscope.suggest
        help="propose logical-axis rules and a mesh for your program, proved by compiling "
        "(also: suggest)",
        description="Search the mesh shapes and the assignments of your program's logical "
        "axis names to mesh axes, screen them with arithmetic on its arrays, compile the "
        "leaders with the target's compiler (deviceless) and rank them by the compiled "
        "program's memory and step time. Prints the proposals, what the best changes in your "
        "own rules and every array's spec and bytes per device; writes the best's rules file.",
    )
    p.add_argument(
        "program",
        metavar="FILE.py:FUNCTION",
        help="FUNCTION(mesh, rules) returns the jitted step and its arguments, named with "
        "logical axes (Flax's with_partitioning, shardscope.logical_to_spec)",
    )
    _plan_hardware_options(p, " the steps are timed on")
    p.add_argument(
        "--compiler",
        choices=list(TARGETS),
        help="the compiler that verifies the proposals: the hardware's own (deviceless, the "
        "default where it has one) or cpu (simulated CPU devices)",
    )
    add_request_options(p, SuggestRequest, required=("devices",))
    add_axis_types_option(p)
    p.add_argument("--top", type=positive_int, metavar="N", help="show only the best N")
    p.add_argument(
        "--out",
        metavar="FILE",
        help="where to write the best proposal's rules file (default suggested-rules.json); "
        "for a program without logical names, its mesh and specs file (default "
        "suggested-specs.json)",
    )
    p.add_argument("--json", metavar="FILE", help="write the search as JSON ('-': stdout)")
    p.add_argument("--report", metavar="FILE", help="write a Markdown report")
    add_verbose_option(p)
    p.set_defaults(config=ShardConfig)
