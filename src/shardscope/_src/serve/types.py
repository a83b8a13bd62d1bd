"""The serving planner's records: a plan (:class:`ServePlan`: one layout at one batch, its
memory a device, its time per output token and to the first token, its throughput per chip),
a sweep's result (:class:`ServeResult`), and how a server lays a model over its devices
(:class:`ServeLayout`, :class:`Layout`).

Plain frozen dataclasses with ``to_dict()``; the renderers (table, JSON, PNG) read these and
nothing else. A result's JSON reads back (:meth:`ServeResult.from_dict`), as any schema
version wrote it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from shardscope._src.base.errors import RecordError
from shardscope._src.base.notes import Note, NoteKind, NoteValues
from shardscope._src.base.records import SCHEMA_VERSION, Record, field_of, record_dict
from shardscope._src.base.text import format_mesh_spec
from shardscope._src.base.vocab import Vocab
from shardscope._src.cost.memory import memory_fits
from shardscope._src.mesh import MeshShape
from shardscope._src.plan.estimates import or_list
from shardscope._src.plan.rank import StepSource
from shardscope._src.targets.specs import get_target


class ServeLayout(Vocab):
    """How a server lays a model over its devices: the strategy of that name on a mesh of
    ``model`` and, with replicas, ``data`` or ``expert``."""

    TP = "tp"  # tensor parallelism over every device
    DP_TP = "dp_tp"  # replicas of tensor parallelism, each holding every expert
    EP_TP = "ep_tp"  # replicas of tensor parallelism that split a mixture's experts


@dataclass(frozen=True, kw_only=True)
class ExpertsNotSplitValues(NoteValues):
    """Why no layout of a mixture's serving plans splits its routed experts: the model, its
    experts, the devices, the replica counts its layouts have (an expert axis spans a
    layout's replicas) and the device counts, up to twice as many, that have a layout that
    splits them."""

    optional: ClassVar[tuple[str, ...]] = ()

    model: str
    experts: int
    devices: int
    replicas: tuple[int, ...]
    counts: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", tuple(self.replicas))
        object.__setattr__(self, "counts", tuple(self.counts))


class ServeNote(NoteKind):
    """What a serving result notes (its :class:`~shardscope._src.base.notes.Note` kinds)."""

    #: a mixture none of whose layouts on these devices splits its experts (values:
    #: :class:`ExpertsNotSplitValues`); vLLM splits them unevenly where they do not divide
    #: (vllm-project/vllm vllm/model_executor/layers/fused_moe/layer.py@0014ec6c,
    #: determine_expert_map: "Distribute experts as evenly as possible to each rank", the
    #: remainder one more each on the first ranks), which the planner does not lay out
    EXPERTS_NOT_SPLIT = "experts-not-split"

    def values_of(self, values: Any) -> NoteValues:
        """``values`` as this kind's record, made from their mapping where given one."""
        if isinstance(values, ExpertsNotSplitValues):
            return values
        return ExpertsNotSplitValues.from_dict(values)

    def describe(self, values: Any) -> str:
        """The note's words.

        >>> v = dict(model="m", experts=128, devices=6, replicas=[3, 6], counts=[2, 4, 8])
        >>> print(Note(ServeNote.EXPERTS_NOT_SPLIT, v))
        no layout of 6 devices splits m's 128 routed experts (2, 4 or 8 devices do): the \
planner splits them evenly over a layout's replicas, 3 (tensor parallelism over 2) or 6 \
(over 1), and none of those divides 128, so each replica holds every expert (dp_tp); an \
engine that splits them unevenly (vLLM's expert parallelism: 22 or 21 a rank of 6) is not \
planned
        """
        v = self.values_of(values)
        assert isinstance(v, ExpertsNotSplitValues)
        counts = (
            f"{or_list(v.counts)} devices do"
            if v.counts
            else f"no device count up to {2 * v.devices} does"
        )
        first, *rest = (
            f"{r} (tensor parallelism over {v.devices // r})" if i == 0 else
            f"{r} (over {v.devices // r})"
            for i, r in enumerate(v.replicas)
        )  # fmt: skip
        r = v.replicas[-1]
        return (
            f"no layout of {v.devices} devices splits {v.model}'s {v.experts} routed experts "
            f"({counts}): the planner splits them evenly over a layout's replicas, "
            f"{or_list([first, *rest])}, and none of those divides {v.experts}, so each "
            f"replica holds every expert (dp_tp); an engine that splits them unevenly (vLLM's "
            f"expert parallelism: {-(-v.experts // r)} or {v.experts // r} a rank of {r}) is "
            f"not planned"
        )


@dataclass(frozen=True)
class Layout:
    """``replicas`` of tensor parallelism over ``t`` devices; a mixture's routed experts
    split over the replicas (``ep_tp``: the attention data-parallel over ``expert``, each
    device ``experts / replicas`` experts) or held by each (``dp_tp``)."""

    strategy: ServeLayout
    t: int
    replicas: int

    @property
    def mesh(self) -> MeshShape:
        """``model=t``, with ``data`` (or ``expert``) first where there are replicas."""
        r, t = self.replicas, self.t
        if self.strategy is ServeLayout.EP_TP:
            return MeshShape((("expert", r), ("model", t)))
        return MeshShape((("data", r), ("model", t)) if r > 1 else (("model", t),))

    @property
    def expert_parallel(self) -> int:
        return self.replicas if self.strategy is ServeLayout.EP_TP else 1


@dataclass(frozen=True)
class ServePlan(Record):
    """One layout serving ``batch`` sequences of ``context`` tokens on ``devices``."""

    strategy: str
    mesh: dict[str, int]
    batch: int
    context: int
    weight_bytes_per_device: int
    cache_bytes_per_device: int
    temp_bytes_per_device: int
    memory_limit_bytes: int
    decode_step_s: float
    decode_memory_s: float
    decode_compute_s: float
    decode_comm_s: float
    first_token_s: float
    tokens_per_s_per_chip: float
    pareto: bool = False
    #: the target whose compiler compiled this plan's decode step (None: estimated): its
    #: memory per device is that compile's buffers (``temp_bytes_per_device`` the rest of
    #: them beyond the weights and the cache), its all-reduces the compiled ones
    compiled_by: str | None = None
    #: the compiled decode step's all-reduces a step (0 when not compiled)
    compiled_all_reduces: int = 0
    #: the kernels the decode step launches, each priced at the hardware's
    #: ``kernel_launch_s`` in ``decode_step_s``: the compiled step's, or on an estimated
    #: plan its layout's compiled step's, or where the layout has none those of the
    #: model's structure (:func:`~shardscope._src.serve.estimate.decode_kernels`)
    decode_kernels: int = 0
    #: the devices that hold each key/value head (above 1 where tensor parallelism is wider
    #: than the model's key/value heads)
    kv_replicas: int = 1
    #: the value of the engine's memory setting that ``memory_limit_bytes`` is held to
    #: (:meth:`~shardscope._src.targets.engines.Engine.memory_fraction`: vLLM's
    #: ``gpu_memory_utilization``, SGLang's ``mem_fraction_static`` for this plan's tensor
    #: parallelism, ...): what to start the engine with; None on an engine with no rule
    engine_memory_share: float | None = None
    #: at a request rate (:mod:`~shardscope._src.serve.online`): the mean sequences in flight
    #: (``batch`` is what the cache holds: each replica's 99th percentile of its own), the
    #: decode step alone at ``batch`` and one prompt's prefill alone, which
    #: ``decode_step_s`` and ``first_token_s`` stretch by the load; None without a rate
    in_flight: float | None = None
    decode_iteration_s: float | None = None
    prefill_s: float | None = None
    #: the serving engine whose host costs the plan's times pay
    #: (:data:`~shardscope._src.targets.engines.ENGINES`; ``none``: the device's alone, as
    #: every plan before them), and what its host adds to ``decode_step_s`` (its work an
    #: iteration, or on an engine that overlaps it with the device what the step does not
    #: cover); ``first_token_s`` pays its prefill iteration's and, from
    #: :func:`~shardscope._src.serve.search.serve_request`, its request's
    engine: str = "none"
    decode_host_s: float = 0.0
    #: the estimate whose figures a compile replaced (its decode step's, its prefill's, or
    #: its layout's at another batch), kept beside them as a training plan keeps its
    #: ``estimated_time``; None: the plan is the estimate. Not written to JSON.
    estimate: ServePlan | None = field(default=None, compare=False, repr=False)

    @property
    def estimated(self) -> ServePlan:
        """The plan as estimated, before any compile replaced its figures."""
        return self.estimate if self.estimate is not None else self

    @property
    def step_time_s(self) -> float:
        """The step time it is ranked by: its time per output token (``decode_step_s``)."""
        return self.decode_step_s

    @property
    def step_source(self) -> StepSource:
        """Compiled where its decode step was (``compiled_by``), else estimated; either way
        :attr:`estimated` is the plan as estimated."""
        return StepSource.ESTIMATED if self.compiled_by is None else StepSource.COMPILED

    def to_dict(self) -> dict[str, Any]:
        return record_dict(self, omit=("estimate",))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServePlan:
        """The plan its :meth:`to_dict` wrote (without the estimate, which the JSON does
        not hold); a field it lacks takes its default (a file written before it was)."""
        what = "a serving plan"
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name == "estimate":
                continue
            if f.default is dataclasses.MISSING:
                values[f.name] = field_of(data, f.name, what)
            elif f.name in data:
                values[f.name] = data[f.name]
        values["mesh"] = {str(k): int(v) for k, v in values["mesh"].items()}
        return cls(**values)

    @property
    def memory_bytes_per_device(self) -> int:
        return (
            self.weight_bytes_per_device + self.cache_bytes_per_device + self.temp_bytes_per_device
        )

    @property
    def fits(self) -> bool:
        return memory_fits(self.memory_bytes_per_device, self.memory_limit_bytes)

    @property
    def tensor_parallel(self) -> int:
        return self.mesh["model"]

    @property
    def replicas(self) -> int:
        """The attention's data-parallel replicas: the shards of the batch (over ``data``,
        or over ``expert`` where the experts are split)."""
        return self.mesh.get("data", 1) * self.mesh.get("expert", 1)

    @property
    def expert_parallel(self) -> int:
        """The devices a mixture's routed experts are split over (1: each replica holds
        every expert)."""
        return self.mesh.get("expert", 1)

    @property
    def layout(self) -> Layout:
        return Layout(ServeLayout(self.strategy), self.tensor_parallel, self.replicas)

    @property
    def batch_axis(self) -> str | None:
        """The mesh axis the sequences are split over (None without replicas)."""
        return next((a for a in ("data", "expert") if a in self.mesh), None)

    @property
    def label(self) -> str:
        return f"{self.strategy} {format_mesh_spec(self.mesh)} batch {self.batch}"


@dataclass(frozen=True)
class ServeResult(Record):
    """Every layout and batch that fits, best throughput per chip first; ``best`` is the
    highest throughput per chip (with ``latency``, among the plans whose time per output
    token meets it); ``front`` the plans no other beats on both latency and throughput."""

    model: str
    devices: int
    hardware: str
    prompt: int
    output: int
    context: int
    weights: str
    cache: str
    latency: float | None
    plans: tuple[ServePlan, ...]
    #: a mixture's routing as served: the busiest expert's tokens over its even share,
    #: whether each token goes once to each device of its experts, and whether each slot's
    #: router weight goes with it to scale its expert's activation (Megatron-Core's experts)
    imbalance: float = 1.0
    dispatch_once: bool = False
    weight_activations: bool = False
    #: requests a second arriving at the devices (None: each plan at its batch)
    rate: float | None = None
    #: clients in a closed loop, each sending its next request when its last one ends
    #: (None: each plan at its batch, or at the rate)
    clients: int | None = None
    #: the serving engine whose host costs the plans pay (``none`` before there were any)
    engine: str = "none"
    #: under a load, the tokens an iteration of a chunked prefill carried (None: each prompt
    #: prefilled whole, or no load)
    chunked_prefill: int | None = None
    #: the fused causal kernel a prefill's attention core was priced as
    #: (:func:`~shardscope._src.cost.compute.prefill_attention`: the engine's on that GPU, or
    #: ``attention_fwd_flops``, the hardware's own rate); None: at the matmul rate, counted
    #: non-causal (no published rate for that device, or a result from before there was one)
    prefill_attention: str | None = None
    #: the share of a device's memory the engine held, as the request gave it (None: the
    #: engine's own; each plan's ``memory_limit_bytes`` is what it let a device hold)
    memory_share: float | None = None
    #: what the reader should know beyond the plans (:class:`ServeNote`)
    notes: tuple[Note, ...] = ()

    @property
    def best(self) -> ServePlan:
        return self.plans[0]

    @property
    def backend(self) -> str | None:
        """The platform of the compiler that compiled its plans' steps (the family of their
        ``compiled_by`` target: ``"gpu"`` or ``"tpu"``), as every JSON result's header names
        it; None when no plan was compiled (each an estimate, as with ``compiler="cpu"``).
        Before schema version 4 the JSON wrote ``"estimate"`` here, whatever compiled."""
        target = next((p.compiled_by for p in self.plans if p.compiled_by is not None), None)
        return None if target is None else str(get_target(target).family)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServeResult:
        """The result its JSON holds (:func:`~shardscope._src.base.records.write_result`'s
        file, or its :meth:`to_dict`), of any schema version up to this shardscope's: the
        header (``schema_version``, the versions and ``backend``, ``"estimate"`` before
        version 4) is not the result's data, which each version wrote alike.

        Raises:
            RecordError: a file of a later schema version, or not a serving result (naming
                the field it lacks).
        """
        version = data.get("schema_version") if isinstance(data, Mapping) else None
        if version is not None and (not isinstance(version, int) or version > SCHEMA_VERSION):
            raise RecordError(
                f"a serving result of schema version {version!r}: this shardscope reads up "
                f"to version {SCHEMA_VERSION}; read it with the shardscope that wrote it"
            )
        what = "a serving result"
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.default is dataclasses.MISSING:
                values[f.name] = field_of(data, f.name, what)
            elif f.name in data:
                values[f.name] = data[f.name]
        values["plans"] = tuple(ServePlan.from_dict(p) for p in values["plans"])
        values["notes"] = tuple(
            Note(ServeNote(n["kind"]), n["values"], tuple(n.get("params", ())))
            for n in values.get("notes", ())
        )
        return cls(**values)

    @property
    def front(self) -> tuple[ServePlan, ...]:
        return tuple(p for p in self.plans if p.pareto)
