"""Suggesting logical-axis rules for a user's program: searched, screened, then compiled.

How it searches, and why this way:

1. **The program's arrays, once.** ``make_step`` is built on a probe mesh whose axes are the
   program's logical names (each of size 1) under the identity rules (``embed -> embed``), so
   every argument's ``PartitionSpec`` spells its dimensions' logical names. One build, one
   device, nothing compiled. Flax NNX passes a name its rules do not map through as it is,
   so a program naming an axis the rules lack fails here, with the name.
2. **Every candidate.** Each mesh shape of the devices over the axes (:func:`mesh_shapes`)
   times each assignment of every logical name to one mesh axis or to none. An axis of size 1
   shards nothing, so it counts as none and equal candidates are kept once; where every device
   sits in one node and the program names no mesh axis itself, so are mirror images (the same
   names on another axis of the same size: :func:`_signature`), the one that keeps the batch
   on the first axis standing for them. A name whose arrays are weights (with their optimizer
   state) under :data:`NEGLIGIBLE_SHARE` of the arguments' bytes (:func:`negligible_names`: a
   norm's scale) is not searched: it stays on none. A candidate is dropped when an array would
   use a mesh axis twice (Flax NNX refuses that) or a dimension is not divisible by its
   axes.
3. **A cheap screen.** Arithmetic on the probed arrays alone. The weights are the arrays
   the optimizer's state mirrors (a parameter's path ends its moments' paths), so layers
   that share shapes are told apart from the tokens. Memory: bytes per device of every
   argument. Compute: the step's FLOPs (JAX's count of the probe's lowering) over the
   devices doing distinct work (the batch's axes split all of it, a model axis the share of
   the weights it splits). Communication, per mesh axis at the hardware's alpha-beta: over
   a batch axis, the gradients of the weights it does not split all-reduced (combined, as
   XLA combines them) and those it splits too gathered twice and scattered once (FSDP);
   over a model axis, the tokens' activations (``flops / (6 x weights)`` tokens) met
   forward and backward once per pair of weights that enter and leave a split dimension
   (Megatron's tensor parallelism). It cannot see what the compiler will do, only rank.
4. **The compiler decides.** Half of the ``compiles`` go to the screen's leader of each mesh
   shape, then its next best; the rest, two at a time, to the neighbours of the best plan
   compiled so far (one name moved to another axis or to none, or the same names on the next
   mesh shape), the screen's order choosing among them: a local search over the compiled
   programs, since the screen is coarse and the compiler is the judge. It stops when every
   neighbour of the best has been compiled and none is faster (``settled``: a local optimum
   the compiler checked) or at the budget. Each compile is the planner's own
   (:func:`~shardscope._src.program.program.compile_program`, the loop :func:`plan_program`
   runs) and the plans are ranked as it ranks: those that fit first, then the estimated step
   time. Every order is total (ties fall to the mesh sizes and the rules), so the same input
   gives the same ranking.
5. **The yardstick, compiled only where it can be.** The user's own rule sets on every mesh
   shape give the ``ratio`` its denominator: their best plan. A plan of the same layout as
   one compiled before (:func:`~shardscope._src.program.program.layout_key`: the mesh and
   what the rules place; the search's candidates among them) is that compile, not another.
   The others are compiled unless they cannot be the best: a plan's step takes at least its
   compute on the devices that do distinct work (:func:`compute_floor`; along a mesh axis
   no rule names, every device repeats the others' work), and a plan whose floor is above
   the best plan compiled so far is left out (skipped as ``slower``). The screen does not
   decide this: it ranks, and on the lm1b-sized decoder of ``benchmarks/suggest_lm1b.py``
   it put the user's best plan (FSDP on 8 devices: 8.83 ms compiled, 18.8 ms screened)
   fifth of the six that use every device, below one compiled at 9.62 ms (10.2 ms
   screened); screened out, it would have left the ratio at 0.97 instead of 1.06.

A program without logical names (a plain pytree, an Equinox module) gets names from its
dataflow first (:func:`by_dataflow`, :mod:`shardscope._src.program.dataflow`), one per axis the
step's operations join, and is then searched the same way; each proposal carries a
``PartitionSpec`` per array.

Why not an integer program: the costs that decide (which collectives XLA inserts, what it
keeps for the backward, what it overlaps) are the compiler's, not a sum of per-array terms a
solver could weigh exactly; the candidates are few enough (3**7 for seven names on two axes)
to screen every one by arithmetic in well under a second, and the compiles, seconds each, are
what is budgeted, spent where the compiled results point.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from shardscope._src.audit.names import carried_names
from shardscope._src.audit.stages import (
    axis_type_error,
    build_step,
    check_step_pair,
    lower,
    program_stage,
)
from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.comm import format_bytes, format_memory, traffic_bytes
from shardscope._src.base.errors import PlanError, RulesError, is_int, one_line
from shardscope._src.base.notes import Note
from shardscope._src.base.records import record_dict
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.cost.compute import matmul_seconds, serial_seconds
from shardscope._src.cost.links import collective_seconds
from shardscope._src.cost.memory import memory_fits
from shardscope._src.mesh import axis_types_of, make_mesh
from shardscope._src.plan.cluster import RayPool, ray_requested
from shardscope._src.plan.compile import local_devices
from shardscope._src.plan.notes import (
    AllReplicatedValues,
    KeepOwnValues,
    NegligibleNamesValues,
    PlanNote,
    compiled_memory_words,
)
from shardscope._src.plan.rank import StepSource
from shardscope._src.plan.request import DEFAULT_AXES, ProgramRequest, SuggestRequest
from shardscope._src.plan.types import Skipped, SkipReason, skipped_by_reason
from shardscope._src.plan.worker import WorkerPool
from shardscope._src.program.dataflow import (
    ProbedArray,
    by_dataflow,
    key_name,
    lowered_flops,
    weights,
)
from shardscope._src.program.program import (
    CompileCache,
    ProgramPlan,
    ProgramPlanResult,
    compile_program,
    mark_same,
    mesh_list,
    mesh_shapes,
    one_compiler,
    plan_rule_sets,
    program_name,
    program_ref,
    rank_plans,
    repeated_work_note,
    target_hardware,
)
from shardscope._src.sharding.rules import (
    Rules,
    RuleSets,
    check_rules_axes,
    find_rule_sets,
    refused_axis,
    rules_context,
    sharded_rules,
    takes_rules,
    unmapped_name_error,
    uses_flax,
)
from shardscope._src.targets.hardware import Hardware
from shardscope._src.targets.specs import CPU_TARGET, get_target

#: The rule set name the written rules file holds.
SUGGESTED = "suggested"
#: Where :meth:`SuggestResult.write_rules` writes by default: the best's rules file, or for a
#: program without logical names (searched array by array) its mesh and specs file.
RULES_FILE = "suggested-rules.json"
SPECS_FILE = "suggested-specs.json"


#: What to do about candidates skipped for a reason, where there is a fix: the words that
#: follow their count ("4 candidates do not type-check ...").
SKIP_FIXES = {
    SkipReason.TYPE_CHECK: (
        "do not type-check on Explicit axes (the program gives no out_sharding for them); "
        "--axis-types auto (axis_types='auto') lets the compiler choose their shardings"
    ),
}


# -- records ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Screen:
    """The screen's arithmetic for one candidate (a ranking, not a prediction)."""

    argument_bytes_per_device: int
    compute_time_s: float
    comm_time_s: float
    fits: bool

    @property
    def step_time_s(self) -> float:
        return serial_seconds(self.compute_time_s, self.comm_time_s)

    @property
    def step_source(self) -> StepSource:
        return StepSource.ESTIMATED


@dataclass(frozen=True)
class ArrayShard:
    """One argument under a proposal: its spec over the mesh axes and its bytes per device."""

    path: str
    shape: tuple[int, ...]
    spec: tuple[str | None, ...]
    bytes_per_device: int


@dataclass(frozen=True)
class Proposal:
    """One suggested rule set on one mesh shape, compiled; ``rank`` 1 is the best.

    ``plan`` is the planner's record of the compile (collectives, memory, time); ``ratio`` the
    step time over that of the best plan of the user's own rules (None without them).
    """

    plan: ProgramPlan
    screen: Screen
    arrays: tuple[ArrayShard, ...]
    ratio: float | None = None

    @property
    def rank(self) -> int:
        return self.plan.rank

    @property
    def mesh(self) -> Mapping[str, int]:
        return self.plan.mesh

    @property
    def rules(self) -> Rules:
        return self.plan.rules

    @property
    def label(self) -> str:
        return self.plan.label

    @property
    def memory_bytes_per_device(self) -> int:
        return self.plan.memory_bytes_per_device

    @property
    def step_time_s(self) -> float:
        return self.plan.step_time_s

    @property
    def step_source(self) -> StepSource:
        """Compiled: a proposal is its rule set's compiled program (``screen`` keeps the
        estimate that chose it)."""
        return StepSource.COMPILED

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def working_devices(self) -> float | None:
        """The devices that do distinct work, by the compiled program
        (:attr:`~shardscope._src.program.program.ProgramPlan.working_devices`)."""
        return self.plan.working_devices

    @property
    def replicated(self) -> bool:
        """Whether every argument is whole on every device (its spec splits nothing)."""
        return all(a is None for shard in self.arrays for a in shard.spec)

    @property
    def specs(self) -> dict[str, PartitionSpec]:
        """Every argument's ``PartitionSpec`` by its path (``jax.tree_util.keystr``)."""
        return {a.path: PartitionSpec(*a.spec) for a in self.arrays}

    def rules_file(self, axes: Sequence[str]) -> dict[str, Any]:
        """The rules file of this proposal, as ``audit``, ``plan --program`` and ``suggest``
        read one; its pairs are what Flax's ``logical_axis_rules`` takes."""
        return {"axes": list(axes), "rules": {SUGGESTED: [list(p) for p in self.rules]}}

    def specs_file(self) -> dict[str, Any]:
        """The mesh and every argument's spec by its path (a program without names)."""
        return {
            "mesh": dict(self.mesh),
            "specs": {a.path: list(a.spec) for a in self.arrays},
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "label": self.label,
            "mesh": dict(self.mesh),
            "rules": [list(p) for p in self.rules],
            "memory_bytes_per_device": self.memory_bytes_per_device,
            "step_time_s": self.step_time_s,
            "fits": self.fits,
            "ratio_to_own": self.ratio,
            "screen": record_dict(self.screen, extra=("step_time_s",)),
            "arrays": [record_dict(a) for a in self.arrays],
            "plan": self.plan.to_dict(),
        }


@dataclass(frozen=True)
class Change:
    """What the best proposal changes in the user's best plan: the mesh, each logical name
    whose mesh axis differs (None: replicated), and what that buys by the same cost model."""

    own_label: str
    own_mesh: Mapping[str, int]
    mesh: Mapping[str, int]
    moves: tuple[tuple[str, str | None, str | None], ...]
    own_step_time_s: float
    step_time_s: float
    own_memory_bytes_per_device: int
    memory_bytes_per_device: int
    #: whether the two shard every name alike (the same program, meshes written apart)
    same: bool = False

    @property
    def speedup(self) -> float:
        """The user's best step time over the proposal's (> 1: the proposal is faster)."""
        return self.own_step_time_s / self.step_time_s if self.step_time_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **record_dict(self, extra=("speedup",)),
            "moves": [list(m) for m in self.moves],
        }


@dataclass(frozen=True)
class SuggestResult:
    """A search of a program's shardings: proposals best first, and how the search went."""

    program: str
    devices: int
    hardware: Hardware
    axes: tuple[str, ...]
    names: tuple[str, ...]
    arrays: tuple[ProbedArray, ...]
    proposals: tuple[Proposal, ...]
    skipped: tuple[Skipped, ...]
    own: ProgramPlanResult | None
    candidates: int
    compiled: int
    target: str = "cpu"
    wall_s: float = 0.0
    timing: Mapping[str, float] = field(default_factory=dict)
    #: searched array by array (a program without logical names)
    by_dataflow: bool = False
    #: every neighbour of the best (one name moved, or the next mesh shape) was compiled and
    #: none is faster: a local optimum the compiler checked (False: the budget ran out first)
    settled: bool = False
    #: the compiles the yardstick (the user's own rule sets) ran, and its plans it took from
    #: a compile of the same layout instead (the search's, or one of its own)
    own_compiled: int = 0
    own_shared: int = 0
    #: the screened candidates as distinct layouts: those that compile to one program (they
    #: differ in axes of size 1, or are mirror images: :func:`_signature`) counted once
    layouts: int = 0
    #: the names not searched, each with the bytes of its arrays (:func:`negligible_names`):
    #: replicated in every proposal
    negligible: tuple[tuple[str, int], ...] = ()

    @property
    def backend(self) -> str:
        """The platform of the compiler that verified the proposals: ``"cpu"``, ``"gpu"`` or
        ``"tpu"``."""
        return get_target(self.target).family

    @property
    def best(self) -> Proposal | None:
        """The fastest compiled proposal that fits the device memory (None when none fits);
        where :attr:`keep_own`, the user's own best is at least as fast."""
        return next((p for p in self.proposals if p.fits), None)

    @property
    def keep_own(self) -> bool:
        """Whether the answer is the user's own rules: their best plan (:attr:`own_best`)
        fits and no compiled proposal that fits is faster (equal counts as not faster). Then
        :meth:`rules_file` holds that plan's rule set, not :attr:`best`'s, and the first note
        (``keep-own``) says so."""
        own, best = self.own_best, self.best
        return own is not None and (best is None or own.step_time_s <= best.step_time_s)

    @property
    def notes(self) -> tuple[Note, ...]:
        """What the proposals want their reader to know, the answer first: where
        :attr:`keep_own`, that note (``keep-own``); where the best replicates every array and
        the fastest proposal that splits the work (and fits) spends more time on collectives
        than it saves in compute, that note (``all-replicated``), else where the answer leaves
        devices repeating others' work, how many do distinct work (``repeated-work``); where
        names were too small to search (:attr:`negligible`), which (``negligible-names``); then
        the notes the plan of the user's rules makes of those of them that change nothing
        (``unused-rules``)."""
        own = self.own_best
        first: tuple[Note, ...] = ()
        if own is not None and self.keep_own:
            values = KeepOwnValues(
                proposals=len(self.proposals),
                fitting=sum(p.fits for p in self.proposals),
                rules_name=own.rules_name,
                mesh=own.mesh_spec,
                step_s=own.step_time_s,
                memory_bytes=own.memory_bytes_per_device,
                settled=self.settled,
            )
            first = (Note(PlanNote.KEEP_OWN, values),)
        replicated = self._replicated_notes()
        # all replicated says it already: each device does the whole step
        repeated = () if replicated else self._repeated_notes()
        # the user's rules that change nothing, as their plan noted them
        mine = self.own.notes if self.own is not None else ()
        unused = tuple(n for n in mine if n.kind == PlanNote.UNUSED_RULES)
        return first + replicated + repeated + self._negligible_notes() + unused

    def _repeated_notes(self) -> tuple[Note, ...]:
        """Where the answer (the user's best where :attr:`keep_own`, else the best proposal)
        leaves devices repeating others' work, that note (``repeated-work``)."""
        own, best = self.own_best, self.best
        if own is not None and self.keep_own:
            note = repeated_work_note(own, what="your best")
        elif best is not None:
            label = f"{sharded_rules(best.rules)} on {format_mesh_spec(best.mesh)}"
            note = repeated_work_note(best.plan, label=label)
        else:
            note = None
        return () if note is None else (note,)

    def _negligible_notes(self) -> tuple[Note, ...]:
        if not self.negligible:
            return ()
        values = NegligibleNamesValues(
            names=tuple(n for n, _ in self.negligible),
            bytes=sum(b for _, b in self.negligible),
            arguments_bytes=sum(a.nbytes for a in self.arrays),
            share=NEGLIGIBLE_SHARE,
        )
        return (Note(PlanNote.NEGLIGIBLE_NAMES, values),)

    def _replicated_notes(self) -> tuple[Note, ...]:
        best = self.best
        if best is None or not best.replicated:
            return ()
        split = next((p for p in self.proposals if p.fits and not p.replicated), None)
        if split is None:
            return ()
        saved = best.plan.compute_time_s - split.plan.compute_time_s
        if split.plan.comm_time_s <= saved:
            return ()  # not what made it slower
        values = AllReplicatedValues(
            devices=self.devices,
            split=f"{sharded_rules(split.rules)} on {format_mesh_spec(split.mesh)}",
            saved_s=saved,
            comm_s=split.plan.comm_time_s,
        )
        return (Note(PlanNote.ALL_REPLICATED, values),)

    @property
    def own_best(self) -> ProgramPlan | None:
        """The best plan of the user's own rules (None without rules, or when none fits)."""
        return None if self.own is None else self.own.best

    @property
    def fit_advice(self) -> str | None:
        """When no proposal fits: the arrays that dominate the smallest and the smallest
        device count whose screen fits (None when one fits, or the user's own rules do:
        :attr:`keep_own`)."""
        if self.best is not None or self.keep_own:
            return None
        if not self.proposals:  # nothing compiled: why, not how much memory
            why = [
                f"{len(group)} {SKIP_FIXES[reason]}"
                if reason in SKIP_FIXES
                else f"{len(group)} skipped for {reason}"
                for reason, group in skipped_by_reason(self.skipped).items()
            ]
            return f"no proposal compiled: {'; '.join(why) or 'no candidate'}"
        return no_fit_advice(
            self.arrays,
            self.names,
            self.axes,
            self.devices,
            self.hardware,
            plans=[p.plan for p in self.proposals],
        )

    @property
    def change(self) -> Change | None:
        """What the best proposal changes in the best plan of the user's own rules (None
        without both)."""
        best, own = self.best, self.own_best
        if best is None or own is None:
            return None
        # an axis of size 1 shards nothing: read as replicated on both sides
        mine = {n: _one_axis(a, own.mesh) for n, a in own.rules}
        theirs = {n: _one_axis(a, best.mesh) for n, a in best.rules}
        moves = tuple(
            (n, mine.get(n), theirs.get(n)) for n in self.names if mine.get(n) != theirs.get(n)
        )
        same = _placement(own.mesh, own.rules, self.names) == _placement(
            best.mesh, best.rules, self.names
        )
        return Change(
            same=same,
            own_label=own.label,
            own_mesh=dict(own.mesh),
            mesh=dict(best.mesh),
            moves=moves,
            own_step_time_s=own.step_time_s,
            step_time_s=best.step_time_s,
            own_memory_bytes_per_device=own.memory_bytes_per_device,
            memory_bytes_per_device=best.memory_bytes_per_device,
        )

    def rules_file(self) -> dict[str, Any]:
        """The rules file of the answer: the best proposal's (its one set named
        ``suggested``), or where :attr:`keep_own` the user's best rule set under its own
        name; for a program without names (searched array by array) the best's mesh and
        specs file. Raises when neither a proposal nor the user's rules fit."""
        own = self.own_best
        if own is not None and self.keep_own:
            return {
                "axes": list(self.axes),
                "rules": {own.rules_name: [list(p) for p in own.rules]},
            }
        if self.best is None:
            raise PlanError(self.fit_advice or f"no proposal for {self.program}")
        if self.by_dataflow:
            return self.best.specs_file()
        return self.best.rules_file(self.axes)

    def rules_text(self) -> str:
        """:meth:`rules_file` as the JSON text the file holds, a rule (or a spec) to a line."""
        data = self.rules_file()
        if "specs" in data:
            lines = ",\n".join(
                f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in data["specs"].items()
            )
            return f'{{\n  "mesh": {json.dumps(data["mesh"])},\n  "specs": {{\n{lines}\n  }}\n}}\n'
        ((name, rules),) = data["rules"].items()
        pairs = ",\n".join(f"      {json.dumps(p)}" for p in rules)
        return (
            f'{{\n  "axes": {json.dumps(data["axes"])},\n  "rules": {{\n'
            f"    {json.dumps(name)}: [\n{pairs}\n    ]\n  }}\n}}\n"
        )

    @property
    def file_name(self) -> str:
        """The name :meth:`write_rules` gives its file by default: ``suggested-rules.json``,
        or ``suggested-specs.json`` for a program without logical names (its specs)."""
        return default_file(self.by_dataflow)

    def write_rules(self, path: Any = None) -> Path:
        """Writes :meth:`rules_text` to ``path`` (default :attr:`file_name`) atomically;
        returns where."""
        text = self.rules_text()
        return write_atomic(self.file_name if path is None else path, lambda f: f.write(text))

    def to_dict(self) -> dict[str, Any]:
        return {
            "program": self.program,
            "devices": self.devices,
            "hardware": self.hardware.name,
            "target": self.target,
            "by_dataflow": self.by_dataflow,
            "settled": self.settled,
            "axes": list(self.axes),
            "names": list(self.names),
            "candidates": self.candidates,
            "layouts": self.layouts,
            "negligible": [list(n) for n in self.negligible],
            "compiled": self.compiled,
            "wall_s": self.wall_s,
            "timing": dict(self.timing),
            "best": None if self.best is None else self.best.label,
            "keep_own": self.keep_own,
            "fit_advice": self.fit_advice,
            "notes": [n.to_dict() for n in self.notes],
            "proposals": [p.to_dict() for p in self.proposals],
            "skipped": [record_dict(s) for s in self.skipped],
            "own_best": None if self.own_best is None else self.own_best.to_dict(),
            "change": None if self.change is None else self.change.to_dict(),
        }


def _placement(
    mesh: Mapping[str, int], rules: Rules, names: Sequence[str]
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """How ``rules`` on ``mesh`` spread each of ``names``: the (size, stride) of each of its
    mesh axes of size > 1 (the stride: the product of the sizes of the axes after it)."""
    order = list(mesh)
    given = dict(rules)
    out = []
    for n in names:
        axes = given.get(n)
        axes = (axes,) if isinstance(axes, str) else tuple(axes or ())
        out.append(
            tuple(
                (mesh[a], math.prod(mesh[b] for b in order[order.index(a) + 1 :]))
                for a in axes
                if mesh.get(a, 1) > 1
            )
        )
    return tuple(out)


def _one_axis(axes: Any, mesh: Mapping[str, int]) -> str | None:
    """A rule's mesh axes as one name (several joined with ``,``), those of size 1 in
    ``mesh`` left out; None for none."""
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    kept = [a for a in names if mesh.get(a, 1) > 1]
    return ",".join(kept) if kept else None


# -- the probe ----------------------------------------------------------------------------------


def probe_program(
    make_step: Callable[..., Any],
    names: Sequence[str],
    *,
    where: str,
    axis_type: Any = None,
    named_by: str = "rules=",
) -> tuple[tuple[ProbedArray, ...], float]:
    """The program's arguments with their logical names, and the step's FLOPs (JAX's count
    of the lowering; 0 when it gives none), from one build on a one-device mesh whose axes
    are ``names`` (those ``named_by`` names: its words in an error).

    Raises:
        AxisTypeError: the program's shardings do not fit the probe's axis types (code
            written for Auto axes on Explicit ones: names ``axis_types='auto'``).
        RulesError: the program could not be built with its logical names as the axes (it
            names one that ``names`` lacks, or a mesh axis of its own).
    """
    mesh = make_mesh(
        {n: 1 for n in names},
        devices=jax.devices()[:1],
        axis_types=axis_type,
    )
    identity = tuple((n, n) for n in names)
    try:
        got = build_step(make_step, mesh, identity, where=where)
        if program_stage(got) is not None:
            raise RulesError(
                f"{where} returned a lowered or compiled program; suggest needs (step, args) "
                f"to search its shardings"
            )
        step, args = check_step_pair(got, where)
        with jax.set_mesh(mesh), rules_context(identity):
            lowered = lower(step, args, {})
    except RulesError:
        raise
    except Exception as e:
        # code written for Auto axes on the probe's Explicit ones: the axis types' fault
        words = f"the probe's mesh (an axis of size 1 per logical name: {', '.join(names)})"
        explained = axis_type_error(e, mesh, where, mesh_words=words)
        if explained is not None:
            raise explained from e
        unmapped = None
        if refused_axis(e) is not None:  # every name the rules lack, not JAX's first alone
            used = carried_names(make_step, names, axis_type=axis_type, where=where)
            unmapped = unmapped_name_error(e, names, named_by, program=where, used=used)
        if unmapped is not None:
            raise unmapped from e
        raise RulesError(
            f"{where} could not be built with its logical names ({', '.join(names)}) as the "
            f"mesh's axes: a name it uses is missing from the rules, or it names mesh axes "
            f"of its own; {one_line(e)}",
            param=("rules", "logical_axes"),
        ) from e
    arrays = []
    flat = jax.tree_util.tree_flatten_with_path(args)[0]
    for path, leaf in flat:
        shape = getattr(leaf, "shape", None)
        dtype = getattr(leaf, "dtype", None)
        if shape is None or dtype is None:
            continue
        spec = getattr(getattr(leaf, "sharding", None), "spec", None) or ()
        dims = []
        for i in range(len(shape)):
            entry = spec[i] if i < len(spec) else None
            dims.append(() if entry is None else (entry,) if isinstance(entry, str) else entry)
        arrays.append(
            ProbedArray(
                path=jax.tree_util.keystr(path),
                shape=tuple(int(d) for d in shape),
                itemsize=jnp.dtype(dtype).itemsize,
                names=tuple(tuple(d) for d in dims),
                keys=tuple(key_name(k) for k in path),
            )
        )
    return tuple(arrays), lowered_flops(lowered)


# -- the search and the screen ------------------------------------------------------------------


def _spec(array: ProbedArray, assign: Mapping[str, str | None]) -> tuple[str | None, ...] | None:
    """``array``'s spec under ``assign`` (one mesh axis or None per dimension), or None when
    it uses a mesh axis twice."""
    used: set[str] = set()
    out: list[str | None] = []
    for names in array.names:
        axes = [a for n in names if (a := assign.get(n)) is not None]
        if len(axes) > 1 or any(a in used for a in axes):
            return None
        used.update(axes)
        out.append(axes[0] if axes else None)
    return tuple(out)


def _shards(spec: Sequence[str | None], sizes: Mapping[str, int]) -> int:
    return math.prod(sizes[a] for a in spec if a is not None)


def _divisible(array: ProbedArray, spec: Sequence[str | None], sizes: Mapping[str, int]) -> bool:
    return all(a is None or d % sizes[a] == 0 for d, a in zip(array.shape, spec, strict=True))


@dataclass(frozen=True)
class Workload:
    """What the screen knows of a step beyond its arrays: its FLOPs, which arrays are weights
    (one flag per array), the weight each array belongs to (its own index, or for an
    optimizer's moment its weight's), the names of the weights' dimensions and the tokens,
    ``flops / (6 x weights)``."""

    flops: float
    weights: tuple[bool, ...]
    weight_names: frozenset[str]
    tokens: float
    owners: tuple[int, ...] = ()
    #: the arrays as ``(index of one, how many alike, a weight)``: arrays of one shape, names
    #: and width shard alike, so the screen prices each kind once (a model's layers)
    groups: tuple[tuple[int, int, bool], ...] = ()


def workload(arrays: Sequence[ProbedArray], flops: float) -> Workload:
    """The :class:`Workload` of a probed program, its weights those :func:`weights` finds."""
    weight, owners = weights(arrays)
    names = frozenset(
        name for a, w in zip(arrays, weight, strict=True) if w for d in a.names for name in d
    )
    params = sum(math.prod(a.shape) for a, w in zip(arrays, weight, strict=True) if w)
    tokens = flops / (6 * params) if params else 0.0
    kinds: dict[tuple[Any, ...], list[int]] = {}
    for i, (a, w) in enumerate(zip(arrays, weight, strict=True)):
        kinds.setdefault((a.shape, a.names, a.itemsize, w), []).append(i)
    groups = tuple((ix[0], len(ix), key[3]) for key, ix in kinds.items())
    return Workload(flops, weight, names, tokens, owners, groups)


def screen(
    arrays: Sequence[ProbedArray],
    assign: Mapping[str, str | None],
    sizes: Mapping[str, int],
    work: Workload,
    hw: Hardware,
) -> Screen | None:
    """The screen of one candidate, or None when an array cannot take it (an axis twice, or
    a dimension its axes do not divide)."""
    used = sorted({a for a in assign.values() if a is not None}, key=list(sizes).index)
    batch = {a for n, a in assign.items() if a is not None and n not in work.weight_names}
    split = math.prod(sizes[a] for a in batch)
    memory = 0
    comm = 0.0

    def price(kind: str, axis: str, payload: float, count: int = 1) -> float:
        """``count`` collectives over ``axis`` moving ``payload`` bytes in all."""
        n = sizes[axis]
        sent = traffic_bytes(kind, int(payload), n)
        return collective_seconds(hw, sizes, kind, (axis,), n, sent, count)

    # each kind of array once, with how many there are
    groups = work.groups or tuple((i, 1, w) for i, w in enumerate(work.weights))
    weights = []
    for i, count, is_weight in groups:
        array = arrays[i]
        spec = _spec(array, assign)
        if spec is None or not _divisible(array, spec, sizes):
            return None
        memory += count * (array.nbytes // _shards(spec, sizes))
        if is_weight and array.shape:
            weights.append((array, spec, count))
    for axis in used:
        if axis not in batch:
            continue
        # Data parallelism: the gradients of the weights the axis does not split all-reduced
        # over it (XLA combines them into one); FSDP (the axis splits the weight too): each
        # gathered for the forward, again for the backward, and its gradient scattered back.
        reduced = sum(
            n * (a.nbytes // _shards(spec, sizes)) for a, spec, n in weights if axis not in spec
        )
        gathered = [
            (n, n * (a.nbytes // _shards(spec, sizes)) * sizes[axis])
            for a, spec, n in weights
            if axis in spec
        ]
        if reduced:
            comm += price("all-reduce", axis, reduced)
        if gathered:
            count = sum(n for n, _ in gathered)
            comm += 3 * price("all-gather", axis, sum(b for _, b in gathered), count)
    # A model axis (one the batch does not use) splitting a weight's dimension: the tokens'
    # activations meet across it where a matmul leaves the split dimension (its partial sums
    # all-reduced) and, in the backward, where one enters it (Megatron's f and g). A
    # dimension entered on a weight's last dimension and left on another's first (Flax's
    # kernels; an Equinox weight is the other way round, which counts alike) makes a pair.
    for axis in used:
        if axis in batch:
            continue
        for name in (n for n, a in assign.items() if a == axis):
            last = [(w, n) for w, _, n in weights if len(w.shape) > 1 and name in w.names[-1]]
            first = [(w, n) for w, _, n in weights if len(w.shape) > 1 and name in w.names[0]]
            n_last, n_first = sum(n for _, n in last), sum(n for _, n in first)
            pairs = min(n_last, n_first) or max(n_last, n_first)
            if not pairs:
                continue
            leave = first or last
            edge = 0 if first else -1
            width = sum(n * (math.prod(w.shape) // w.shape[edge]) for w, n in leave) / sum(
                n for _, n in leave
            )
            acts = work.tokens / split * width * leave[0][0].itemsize
            comm += pairs * 2 * price("all-reduce", axis, acts)
    # The batch's axes split all the work; a model axis only that of the weights it splits.
    parallel = float(split)
    total = sum(n * math.prod(a.shape) for a, _, n in weights)
    for axis in used:
        if axis in batch or not total:
            continue
        part = sum(n * math.prod(a.shape) for a, spec, n in weights if axis in spec)
        parallel /= 1 - part / total + part / total / sizes[axis]
    compute = matmul_seconds(hw, work.flops / parallel)
    return Screen(memory, compute, comm, memory_fits(memory, hw.memory_bytes))


def candidates(
    names: Sequence[str],
    axes: Sequence[str],
    shapes: Sequence[Mapping[str, int]],
    *,
    fixed: Collection[str] = (),
) -> list[tuple[dict[str, int], dict[str, str | None]]]:
    """Every ``(mesh sizes, assignment)``: each name to one axis of size > 1 or to none (the
    ``fixed`` names to none alone), each once per mesh shape, in a fixed order."""
    out = []
    for sizes in shapes:
        live = [a for a in axes if sizes[a] > 1]
        choices = [(None,) if n in fixed else (None, *live) for n in names]
        for choice in itertools.product(*choices):
            out.append((dict(sizes), dict(zip(names, choice, strict=True))))
    return out


#: The share of the arguments' bytes under which a logical name's arrays are too small to
#: search: split over any axis, they change what a device holds by less than this share, and
#: (a weight's matmuls being its elements times the tokens) its matmul FLOPs by less too.
NEGLIGIBLE_SHARE = 0.01


def negligible_names(
    arrays: Sequence[ProbedArray], names: Sequence[str], work: Workload
) -> tuple[tuple[str, int], ...]:
    """The names not worth a compile of their own, each with the bytes of its arrays: those
    that name only weights (and their optimizer state), together under
    :data:`NEGLIGIBLE_SHARE` of every argument's bytes (an RMSNorm's scale). A name on an
    input (the batch's tokens) splits the step's activations, whatever the bytes of the
    input, and one on no argument may name activations inside the step: both are searched."""
    total = sum(a.nbytes for a in arrays)
    owners = work.owners or tuple(range(len(arrays)))
    out = []
    for name in names:
        held = [i for i, a in enumerate(arrays) if any(name in d for d in a.names)]
        if not held or not all(work.weights[owners[i]] for i in held):
            continue
        size = sum(arrays[i].nbytes for i in held)
        if size < NEGLIGIBLE_SHARE * total:
            out.append((name, size))
    return tuple(out)


def no_fit_advice(
    arrays: Sequence[ProbedArray],
    names: Sequence[str],
    axes: Sequence[str],
    devices: int,
    hw: Hardware,
    *,
    plans: Sequence[ProgramPlan] = (),
    doublings: int = 12,
) -> str:
    """Why nothing fits, by what does not. Where the smallest candidate's arguments fit on
    ``devices`` (the screen's arithmetic), the smallest compiled of ``plans`` part by part
    (arguments, outputs, temporaries, aliased) and donation where it would help
    (:func:`~shardscope._src.plan.notes.compiled_memory_words`); else the arrays that
    dominate the smallest candidate and the smallest device count (the devices times a
    power of two) whose arguments alone fit."""

    def smallest(n: int) -> tuple[int, dict[str, int], dict[str, str | None]] | None:
        best = None
        for sizes, assign in candidates(names, axes, mesh_shapes(n, axes)):
            s = screen(arrays, assign, sizes, work, hw)
            if s is not None and (best is None or s.argument_bytes_per_device < best[0]):
                best = (s.argument_bytes_per_device, sizes, assign)
        return best

    work = workload(arrays, 0.0)
    here = smallest(devices)
    words = [f"no proposal fits {format_memory(hw.memory_bytes)} per device on {hw.name}"]
    if here is not None and memory_fits(here[0], hw.memory_bytes) and plans:
        # the arguments fit on the devices asked for: what does not is the rest
        small = min(plans, key=lambda p: p.memory_bytes_per_device)
        m = small.compiled_memory
        parts = compiled_memory_words(
            m.argument_size_in_bytes or 0,
            m.output_size_in_bytes or 0,
            m.temp_size_in_bytes or 0,
            m.alias_size_in_bytes or 0,
            hw.memory_bytes,
        )
        words += [
            f"the arguments fit on {devices} devices (the smallest layout's: "
            f"{format_bytes(here[0])})",
            f"the smallest compiled, {sharded_rules(small.rules)} on {small.mesh_spec}, needs "
            f"{format_bytes(small.memory_bytes_per_device)}: {parts}",
            "use more devices, a smaller batch in make_step, or more memory per device",
        ]
        return "; ".join(words)
    if here is not None:
        need, sizes, assign = here
        # each weight with its optimizer state, each other array alone
        per: dict[int, int] = {}
        for a, owner in zip(arrays, work.owners, strict=True):
            spec = _spec(a, assign) or ()
            per[owner] = per.get(owner, 0) + a.nbytes // _shards(spec, sizes)
        top = sorted(per.items(), key=lambda kv: (-kv[1], kv[0]))[:3]

        def what(i: int) -> str:
            moments = sum(o == i for o in work.owners) - 1
            state = " and its optimizer state" if moments else ""
            return f"{arrays[i].path}{state}"

        words.append(
            f"the smallest needs {format_bytes(need)} of arguments alone, mostly "
            + ", ".join(f"{what(i)} ({format_bytes(b)})" for i, b in top)
        )
    fits_at = None
    for k in range(1, doublings + 1):
        got = smallest(devices * 2**k)
        if got is not None and memory_fits(got[0], hw.memory_bytes):
            fits_at = devices * 2**k
            break
    if fits_at is None:
        words.append(f"no device count up to {devices * 2**doublings} fits")
    else:
        words.append(f"the smallest device count whose arguments fit is {fits_at}")
    return "; ".join(words)


def used_devices(sizes: Mapping[str, int], rules: Rules) -> int:
    """The most devices that can do distinct work under ``rules``, before any compile: the
    product of the sizes of the mesh axes some rule names. Along an axis no rule names, every
    device holds the same shards and computes the same (the program's shardings all come from
    its rules: the probe refuses a program that names mesh axes of its own); an axis that a
    rule names may still split little of the work (a norm's scale alone), which only the
    compiled program tells (``ProgramPlan.working_devices``). An upper bound, as
    :func:`compute_floor` needs one."""
    named = {a for _, axes in rules for a in ((axes,) if isinstance(axes, str) else axes or ())}
    return math.prod(n for a, n in sizes.items() if a in named)


def compute_floor(
    flops: float, hw: Hardware, cache: CompileCache
) -> Callable[[Mapping[str, int], Rules], float]:
    """A lower bound of a plan's step time from its rules and mesh alone: the step's FLOPs
    (the probe's count) over the devices doing distinct work (:func:`used_devices`), at the
    matmul rate, with no communication.

    The compiler counts a program's FLOPs its own way (a GPU plan's are its HLO's): the
    bound is scaled by the least ratio of its count to the probe's that any plan compiled so
    far shows (``cache``'s), and never above 1; before any (or when a count is missing) it is
    0, so nothing is left out on a guess."""

    def floor(sizes: Mapping[str, int], rules: Rules) -> float:
        plans = cache.plans()
        if not flops or not plans:
            return 0.0
        ratios = [
            (p.flops_per_device or 0.0) * used_devices(p.mesh, p.rules) / flops for p in plans
        ]
        return matmul_seconds(hw, min(1.0, *ratios) * flops / used_devices(sizes, rules))

    return floor


def searched_by_array(make_step: Callable[..., Any], args: Any = None) -> bool:
    """Whether :func:`suggest` searches ``make_step`` array by array: given its arguments, or
    a ``make_step(mesh)`` that takes no rules and does not use Flax (no logical names)."""
    return args is not None or (not takes_rules(make_step) and not uses_flax(make_step))


def default_file(by_array: bool) -> str:
    """The default name of the file a search writes (:data:`RULES_FILE`, or
    :data:`SPECS_FILE` for a program searched array by array)."""
    return SPECS_FILE if by_array else RULES_FILE


def default_workers(compiles: int) -> int:
    """Two worker processes where more than three compiles are asked for on a machine of two
    or more cores, else none (see :func:`suggest`)."""
    return 2 if compiles > 3 and (os.cpu_count() or 1) >= 2 else 0


# -- the front door -----------------------------------------------------------------------------


def suggest(
    make_step: Callable[..., Any],
    devices: int = 8,
    *,
    compiler: str | None = None,
    **knobs: Any,
) -> SuggestResult:
    """Proposes logical-axis rules and a mesh shape for a program: :func:`suggest_request` of
    the :class:`~shardscope._src.plan.request.SuggestRequest` its arguments make (see
    :func:`suggest_request` for what each does; ``compiler=`` is the same choice as
    ``target=``, by the name :func:`shardscope.plan` and the command line give it).

    >>> result = suggest(make_step, 8, axis_types="auto")  # doctest: +SKIP
    >>> result.best.label, result.best.fits  # doctest: +SKIP
    ('suggest-3 data=8,model=1', True)
    """
    target = one_compiler(knobs.pop("target", None), compiler)
    return suggest_request(SuggestRequest(make_step, devices, target=target, **knobs))


def suggest_request(request: SuggestRequest) -> SuggestResult:
    """Proposes logical-axis rules and a mesh shape for a program, proved by compiling them.

    Searches every mesh shape of ``devices`` over ``axes`` and every assignment of the
    program's logical names to a mesh axis (or none), screens them with arithmetic on the
    program's arrays and compiles ``compiles`` of them with the planner's compile loop (the
    screen's leaders, then the neighbours of the best compiled), ranked as
    :func:`plan_program` ranks (those that fit first, then the step time). The module
    docstring of ``shardscope._src.suggest.suggest`` says how and why.

    Request fields:
        make_step: ``make_step(mesh, rules)`` returning ``(step, args)``, as
            :func:`plan_program` takes it; its arrays are named with logical names (Flax
            NNX's ``with_partitioning``, :func:`shardscope.logical_to_spec`).
        devices: accelerators to plan for; this process must simulate as many.
        target: compile with this target's compiler (``"h100"``, ``"tpu-v5p"``), deviceless;
            None (or ``"cpu"``): simulated CPU devices. ``compiler=`` is the same choice by
            the name :func:`shardscope.plan` and the command line give it.
        hardware: the preset the step is timed on (default: the target's, else ``h100``).
        hardware_overrides: settings over the preset's (``memory_bytes=``, ...).
        rules: the user's own rule sets, read as :func:`plan_program` reads them (default the
            ``RULES`` of ``make_step``'s module): their logical names are searched and their
            best plan is the yardstick of every proposal's ``ratio``.
        logical_axes: the program's logical names, when no rules name them.
        axes: the mesh axes (default: the rules file's, else ``("data", "model")``).
        compiles: how many candidates the compiler verifies.
        args: the arguments of ``make_step`` when it is the step itself (a jitted function),
            abstract or not, their shardings ignored: a program without logical names. Such a
            program (this, or a ``make_step(mesh)`` that takes no rules and does not use
            Flax) is searched array by array: its dimensions are joined into axes by its
            dataflow (:mod:`shardscope._src.program.dataflow`), and each proposal carries a
            ``PartitionSpec`` per array.
        workers: compile in this many worker processes, each loading the program from its
            file (0: in this process; default: two where the program is a function of a
            file and more than three compiles are asked for, on a machine of two or more
            cores; measured on two cores, 24 compiles of a decoder for 64 H100s by the
            H100 compiler took 64 s against 72 s in one process: a compile already keeps
            more than one core busy).
        ray: compile on a Ray cluster: its head's ``"HOST:PORT"`` (or ``"auto"``), or True
            for the one ``ray.init(...)`` started; a cluster already started by
            ``ray.init`` is used without it. Its workers load the program from its file
            (:mod:`shardscope._src.plan.cluster`).
        compare: plan the user's rule sets too (on every mesh shape) as the yardstick of
            each proposal's ``ratio`` and of :attr:`SuggestResult.change`: the plans that
            could be their best, each layout compiled once (the search's compiles shared).
            False: the rules give only their logical names, so ``axes`` may be other mesh
            axes than those the rules map to.
        axis_types: the meshes' axis types, as in :func:`shardscope.make_mesh`.
        name: what to call the program in the output.

    Returns:
        A :class:`SuggestResult`: ``proposals`` ranked, ``best``, ``to_dict()``, and
        ``write_rules(path)`` for a rules file that ``audit``, ``plan --program`` and Flax's
        ``logical_axis_rules`` (its pairs) take as they are; for a program searched array by
        array, a file of the mesh and each argument's spec, which no reader of rules takes
        (each says so): the specs are given to the arguments in ``make_step``.

    Raises:
        RulesError: no logical names to search, rules naming a mesh axis not among ``axes``
            (where they are compared: the error says to pass ``compare=False``),
            or a program that uses a logical name the rules lack (the error names them).
        AxisTypeError: a program whose shardings do not fit the axis types (code written
            for Auto axes, searched on Explicit ones: the error names ``axis_types='auto'``).
        PlanError: too few devices, a bad ``compiles``, or a ``make_step`` that takes no rules.

    >>> result = suggest(make_step, 8, axis_types="auto")  # doctest: +SKIP
    >>> result.best.label, result.best.fits  # doctest: +SKIP
    ('suggest-3 data=8,model=1', True)
    """
    make_step, devices, args, name = request.make_step, request.devices, request.args, request.name
    rules, logical_axes, axes = request.rules, request.logical_axes, request.axes
    compiles, axis_types, compare = request.compiles, request.axis_types, request.compare
    workers, ray = request.workers, request.ray
    start = time.perf_counter()
    if not is_int(compiles, 1):
        raise PlanError(f"compiles={compiles!r}: must be a positive whole number", param="compiles")
    if not is_int(devices, 1):
        raise PlanError(f"devices={devices!r}: must be a positive whole number", param="devices")
    label = name or program_name(make_step)
    per_array = searched_by_array(make_step, args)
    # a worker loads the program from its file; given arguments stay in this process
    ref = None if args is not None else program_ref(make_step, by_dataflow=per_array)
    if per_array:
        if rules is not None or logical_axes is not None:
            raise RulesError(
                "a program without logical names is searched array by array, with the axes "
                "its dataflow joins; it takes no rules= or logical_axes= (give make_step(mesh, "
                "rules) to search rules)",
                param=("rules", "logical_axes"),
            )
        found = None
        axes = _axes(None, axes)
        make_step, names, probed, probed_flops = by_dataflow(
            make_step, args, where=label, axes=axes, axis_types=axis_types, probe=True
        )
    else:
        found = find_rule_sets(rules, make_step)
        axes = _axes(found, axes, compare=compare)
        names = _logical_names(found, logical_axes)
    target_name, hw = target_hardware(
        request.target, request.hardware, request.hardware_overrides, devices
    )
    if workers is None:
        workers = default_workers(compiles) if ref is not None else 0
    if not is_int(workers, 0):
        raise PlanError(f"workers={workers!r}: must be 0 or more", param="workers")
    if workers and ref is None:
        raise PlanError(
            f"workers={workers}: worker processes load the program from its file, and "
            f"{label} is not a function of a file's module (or its arguments were given); "
            f"pass workers=0",
            param="workers",
        )
    local = None
    remote = ray is not None and ray is not False or ray_requested()
    if target_name is None and not workers and not remote:
        local = local_devices(devices, otherwise=" (the command line does it for you)")
    kinds = axis_types_of(axis_types, axes)
    pool: Any = None
    cpu = devices if target_name is None else 1
    if ray is not None and ray is not False or ray_requested():
        if ref is None:
            raise PlanError(
                f"a Ray cluster's workers load the program from its file, and {label} is not "
                f"a function of a file's module (or its arguments were given); give "
                f"FILE.py:FUNCTION's function, or drop ray=",
                param="ray",
            )
        address = ray if isinstance(ray, str) else None
        pool = RayPool(address, cpu, targets=target_name is not None)
    elif workers:
        pool = WorkerPool(cpu, workers, targets=target_name is not None)

    t0 = time.perf_counter()
    if per_array:
        arrays, flops = probed, probed_flops
    else:
        named_by = "logical_axes=" if found is None else found.source
        arrays, flops = probe_program(
            make_step, names, where=f"{label}(probe)", axis_type=kinds[0], named_by=named_by
        )
    t1 = time.perf_counter()
    shapes = mesh_list(None, axes, devices)
    work = workload(arrays, flops)
    # names whose arrays are too small to matter stay replicated: no compile goes to them
    negligible = negligible_names(arrays, names, work)
    screened: dict[tuple[tuple[int, ...], tuple[tuple[str, str | None], ...]], Screen] = {}
    for sizes, assign in candidates(names, axes, shapes, fixed={n for n, _ in negligible}):
        s = screen(arrays, assign, sizes, work, hw)
        if s is not None:
            screened.setdefault((tuple(sizes.values()), tuple(assign.items())), s)
    order = sorted(
        screened.items(),
        key=lambda kv: (
            not kv[1].fits,
            kv[1].step_time_s,
            kv[1].argument_bytes_per_device,
            kv[0][0],
            tuple(a or "" for _, a in kv[0][1]),
        ),
    )
    # Candidates that differ only in axes of size 1 (data=8,model=1 with the batch on data
    # and data=1,model=8 with it on model) compile to the same program, and so, where every
    # device sits in one node (no axis's groups cross one) and the program names no mesh axis
    # of its own, do those that differ only in the names of the axes (data=2,model=4 with the
    # batch on model and data=4,model=2 with it on data: mirror images). One of each is kept,
    # at the place of the first in the screen's order, and the one that reads most as people
    # write it stands for them all (the batch on the first mesh axis, ``data``).
    mirrors = not per_array and devices <= hw.node_size
    kept: dict[tuple[Any, ...], int] = {}
    unique: list[Any] = []
    for key, s in order:
        sig = _signature(dict(zip(axes, key[0], strict=True)), dict(key[1]), mirrors=mirrors)
        if sig not in kept:
            kept[sig] = len(unique)
            unique.append((key, s))
        elif _reads_better(key, unique[kept[sig]][0], axes, work):
            unique[kept[sig]] = (key, s)
    t2 = time.perf_counter()
    # The screen is a coarse guide: the compiler decides. Half the compiles go to the screen's
    # leader of each mesh shape (then its next best); the rest, round by round, to the
    # best compiled plan's neighbours (one name moved to another axis or to none, or the
    # same names on the next mesh shape), the screen's order choosing among them.
    rule_name = {i: f"candidate-{i + 1}" for i in range(len(unique))}
    by_name = {
        rule_name[i]: (s, dict(zip(axes, key[0], strict=True)), key[1])
        for i, (key, s) in enumerate(unique)
    }
    index_of = {key: i for i, (key, _) in enumerate(unique)}
    firsts = list({key[0]: i for i, (key, _) in reversed(list(enumerate(unique)))}.values())[::-1]
    seed = (firsts + [i for i in range(len(unique)) if i not in firsts])[
        : max(1, (compiles + 1) // 2)
    ]
    done: list[int] = []
    plans: list[ProgramPlan] = []
    skipped: list[Skipped] = []
    fingerprints: dict[tuple[str, str], str] = {}
    # one compile per layout: the yardstick takes the search's where they meet
    cache = CompileCache()

    def run(indices: Sequence[int]) -> None:
        todo = []
        for i in indices:
            key = unique[i][0]
            todo.append((rule_name[i], key[1], dict(zip(axes, key[0], strict=True))))
        facts = compile_program(
            make_step,
            todo,
            hw,
            local,
            label=label,
            target=target_name,
            kinds=kinds,
            pool=pool,
            ref=ref,
            cache=cache,
        )
        got, failed = mark_same(facts, fingerprints)
        done.extend(indices)
        plans.extend(got)
        # a skipped candidate is named by what it shards, as the proposals are
        skipped.extend(replace(f, strategy=sharded_rules(by_name[f.strategy][2])) for f in failed)

    budget = min(compiles, len(unique))
    settled = False

    def uncompiled_neighbours(plan: ProgramPlan) -> list[int]:
        _, sizes, rules_t = by_name[plan.rules_name]
        near = {
            index_of[k]
            for k in _neighbours(sizes, dict(rules_t), shapes, axes, kept, unique, mirrors)
            if index_of[k] not in done
        }
        return sorted(near)

    try:
        run(seed)
        while len(done) < budget:
            ranked = rank_plans(plans, list(rule_name.values()))
            best = next((p for p in ranked if p.fits), None)
            if best is not None and not uncompiled_neighbours(best):
                settled = True  # every neighbour of the best compiled, none better: stop
                break
            nxt: list[int] = []
            for plan in ranked:
                nxt = uncompiled_neighbours(plan)[: max(2, workers)]
                if nxt:
                    break
            if not nxt:  # no compiled plan has a neighbour left: the screen's next
                nxt = [i for i in range(len(unique)) if i not in done][: max(2, workers)]
            run(nxt[: budget - len(done)])
        else:
            ranked = rank_plans(plans, list(rule_name.values()))
            best = next((p for p in ranked if p.fits), None)
            settled = best is not None and not uncompiled_neighbours(best)
        t3 = time.perf_counter()
        own = None
        searched, shared = len(cache), cache.hits
        if found is not None and compare:  # in the search's workers, where it has them
            mine = ProgramRequest(
                make_step,
                devices,
                rules=dict(found.sets),
                axes=axes,
                hardware=hw,
                target=target_name,
                axis_types=axis_types,
                name=label,
            )
            # Only the plans that could be the user's best are compiled: the yardstick is
            # that best, and the floor of a plan's step time (its compute on the devices
            # doing distinct work) leaves out those slower than a plan already compiled.
            floor = compute_floor(flops, hw, cache)
            own = plan_rule_sets(
                mine, pool=pool, ref=ref, cache=cache, floor=floor, batch=max(2, workers)
            )
    finally:
        if pool is not None:
            pool.close()
    ranked = rank_plans(plans, list(rule_name.values()))
    own_time = None if own is None or own.best is None else own.best.step_time_s
    # Named by rank once compiled (the screen's order is not the answer).
    renamed = {p.rules_name: f"{SUGGESTED}-{p.rank}" for p in ranked}
    proposals = []
    for plan in ranked:
        s, sizes, rules_t = by_name[plan.rules_name]
        plan = replace(
            plan,
            rules_name=renamed[plan.rules_name],
            same_as=None if plan.same_as is None else renamed.get(plan.same_as, plan.same_as),
        )
        assign = dict(rules_t)
        shards = tuple(
            ArrayShard(a.path, a.shape, spec, a.nbytes // _shards(spec, sizes))
            for a in arrays
            if (spec := _spec(a, assign)) is not None
        )
        ratio = None if not own_time else plan.step_time_s / own_time
        proposals.append(Proposal(plan, s, shards, ratio))
    return SuggestResult(
        program=label,
        devices=devices,
        hardware=hw,
        axes=axes,
        names=names,
        arrays=arrays,
        proposals=tuple(proposals),
        skipped=tuple(skipped),
        own=own,
        candidates=len(screened),
        layouts=len(unique),
        negligible=negligible,
        compiled=len(done),
        own_compiled=len(cache) - searched,
        own_shared=cache.hits - shared,
        by_dataflow=per_array,
        settled=settled,
        target=target_name or CPU_TARGET.name,
        wall_s=time.perf_counter() - start,
        timing={
            "probe_s": t1 - t0,
            "screen_s": t2 - t1,
            "compile_s": t3 - t2,
            "own_s": time.perf_counter() - t3,
        },
    )


def _neighbours(
    sizes: Mapping[str, int],
    assign: Mapping[str, str | None],
    shapes: Sequence[Mapping[str, int]],
    axes: Sequence[str],
    kept: Mapping[tuple[Any, ...], int],
    unique: Sequence[Any],
    mirrors: bool = False,
) -> list[tuple[Any, ...]]:
    """The screened candidates one step from ``(sizes, assign)``: one name on another axis
    (of size > 1) or on none, on the same mesh; or the same names on a mesh shape that moves a
    factor of two between two axes. Each as its kept equal's key (``mirrors``: equal up to
    the axes' names, as :func:`_signature` groups them)."""
    out = []
    live = [a for a in axes if sizes[a] > 1]
    for name, axis in assign.items():
        for other in (None, *live):
            if other != axis:
                out.append((sizes, {**assign, name: other}))
    for shape in shapes:
        ratio = sorted(shape[a] / sizes[a] for a in axes if shape[a] != sizes[a])
        if ratio == [0.5, 2.0]:
            out.append((shape, dict(assign)))
    keys = []
    for s, a in out:
        i = kept.get(_signature(s, a, mirrors=mirrors))
        if i is not None:
            keys.append(unique[i][0])
    return keys


def _reads_better(
    key: tuple[tuple[int, ...], tuple[tuple[str, str | None], ...]],
    than: tuple[tuple[int, ...], tuple[tuple[str, str | None], ...]],
    axes: Sequence[str],
    work: Workload,
) -> bool:
    """Whether candidate ``key`` reads better than its equal ``than``: more of the batch's
    names (those no weight has) on the mesh's first axis, then larger sizes first."""

    def score(k: tuple[tuple[int, ...], tuple[tuple[str, str | None], ...]]) -> Any:
        on_first = sum(a == axes[0] for n, a in k[1] if n not in work.weight_names)
        return (on_first, k[0])

    return bool(score(key) > score(than))


def _signature(
    sizes: Mapping[str, int], assign: Mapping[str, str | None], *, mirrors: bool = False
) -> tuple[Any, ...]:
    """What a candidate shards: each name's mesh axis as its size and its stride in the
    device order (the product of the sizes of the axes after it; the last axis is the
    innermost, within a node first), or none. Candidates that differ only in axes no name
    uses, or of size 1, group the devices alike and compile to the same program.

    ``mirrors``: where the device order cannot matter (every device in one node) and the
    program names no mesh axis itself, up to the axes' names: each axis that holds a name as
    its size and the names on it, in sorted order, so that a mirror image (the same names on
    the other axis of the same size) is the same candidate, and so is any mesh shape whose
    other devices repeat the same work (every name replicated: one program on any shape).

    >>> a = _signature({"data": 2, "model": 4}, {"batch": "model", "mlp": "data"}, mirrors=True)
    >>> a == _signature({"data": 4, "model": 2}, {"batch": "data", "mlp": "model"}, mirrors=True)
    True
    """
    if mirrors:
        on: dict[str, list[str]] = {}
        for name, axis in assign.items():
            if axis is not None and sizes[axis] > 1:
                on.setdefault(axis, []).append(name)
        return tuple(sorted((sizes[a], tuple(sorted(names))) for a, names in on.items()))
    order = list(sizes)

    def place(axis: str | None) -> tuple[int, int]:
        if axis is None or sizes[axis] == 1:
            return (1, 0)
        return (sizes[axis], math.prod(sizes[a] for a in order[order.index(axis) + 1 :]))

    return tuple((n, place(a)) for n, a in assign.items())


def _axes(
    found: RuleSets | None, axes: Sequence[str] | None, *, compare: bool = True
) -> tuple[str, ...]:
    """The mesh axes to search: the rules file's, else ``axes``, else :data:`DEFAULT_AXES`.
    Where the user's rules are the yardstick (``compare``) they are planned on these axes, so
    each must map to them; without it they give only their logical names, and any axes do."""
    if found is not None and found.axes:
        if axes:
            raise PlanError(
                f"axes={tuple(axes)!r} and {found.source} both name the mesh axes; keep one",
                param=("axes", "rules"),
            )
        axes = found.axes
    out = tuple(axes or DEFAULT_AXES)
    if len(set(out)) != len(out):
        raise PlanError(f"axes {out} name an axis twice", param="axes")
    if found is not None and compare:
        try:
            check_rules_axes(found.sets, out)
        except RulesError as e:
            raise RulesError(
                f"{e}; the search plans {found.source} on its mesh axes as the yardstick of "
                f"its proposals: to search the axes {', '.join(out)} with only the rules' "
                f"logical names, pass compare=False, or give rules that map to those axes (a "
                f'rules file with "axes")',
                param=("compare", "rules"),
            ) from e
    return out


def _logical_names(found: RuleSets | None, logical_axes: Sequence[str] | None) -> tuple[str, ...]:
    """The logical names to search: ``logical_axes`` and those the rules name, in order."""
    seen: dict[str, None] = dict.fromkeys(logical_axes or ())
    for rules in found.sets.values() if found is not None else ():
        for logical, _ in rules:
            seen.setdefault(logical, None)
    if not seen:
        raise RulesError(
            "no logical axis names to search: give rules (pairs, named sets or a rules file), "
            "define RULES in the program's module, or name them with logical_axes=('batch', "
            "'embed', ...)",
            param=("rules", "logical_axes"),
        )
    bad = [n for n in seen if not isinstance(n, str) or not n]
    if bad:
        raise RulesError(f"logical axis names {bad!r} must be non-empty strings")
    return tuple(seen)
