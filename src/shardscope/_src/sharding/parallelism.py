"""Parallelism as orthogonal dimensions: a training plan's strategy is one choice along each.

* **data** (:class:`DataParallel`): how the batch's devices hold the model state: ``none``
  (no data axis), ``dp`` (replicated), ``zero1`` (the optimizer state sharded: Megatron-LM's
  distributed optimizer), ``zero2`` (the gradients too), ``fsdp`` (the parameters too,
  gathered at use), ``hsdp`` (FSDP inside a node, replicated across nodes over ``replica``);
* **tensor** (:class:`Tensor`): ``none``, ``tp`` (Megatron's column- and row-parallel
  projections over ``model``) or ``sp`` (``tp`` with the residual stream's sequence split over
  ``model`` between blocks);
* **context**: the sequence of every activation split over ``context``, its keys and values
  exchanged one of two ways (:class:`ContextComm`, MaxText's ``context_parallel_strategy``,
  Megatron-LM's ``--cp-comm-type``): ``all_gather`` (the default: each layer all-gathers the
  whole sequence's keys and values; MaxText's and torchtitan's form) or ``ring`` (each
  device passes its chunk of them around a ring in ``c - 1`` steps, each overlapped with the
  attention on the chunk in hand: ring attention, Megatron-LM and Transformer Engine's
  default ``p2p``);
* **expert**: a mixture of experts' routed experts split over ``expert`` (the attention
  data-parallel over it: expert parallelism borrows data-parallel devices, as Megatron-LM's
  and torchtitan's do); it composes with every data flavour but HSDP and with ``tp`` or
  ``sp``, both at once (``zero1_ep_tp``: each expert's hidden split over ``model`` too, its
  output all-reduced over it), and with context parallelism (``zero1_ep_cp``,
  ``zero1_ep_sp_cp_ring``: Megatron-Core's EP with CP, each device of ``context`` routing its
  own chunk of every sequence as its own group, the all-to-alls over ``expert``, the dense
  weights' data-parallel group ``data x expert x context`` and the experts'
  ``data x context``). With ``sp``
  (``zero1_ep_sp``, Megatron-LM's default for a mixture under tensor parallelism: it requires
  ``--sequence-parallel`` with tensor and expert parallelism, and its
  ``--expert-tensor-parallel-size`` defaults to the tensor-parallel size) each device of
  ``model`` routes its own slice of the sequence, sends its slots over ``expert``, and the
  slots that arrive are all-gathered over ``model`` for the experts' split hidden and their
  outputs reduce-scattered back before the combine (Megatron-Core's
  ``MoEAlltoAllTokenDispatcher``: all-to-all over EP, then all-gather over TP; reduce-scatter
  over TP, then all-to-all over EP). Its folded form (``fold``, :attr:`Parallelism.expert_fold`: MoE
  parallel folding, Liu et al., arXiv 2504.14960; Megatron-LM's
  ``--expert-tensor-parallel-size 1``) regroups the attention's ``expert x model`` devices
  for the experts: the experts split over both axes, each expert whole, the tokens taken to
  them by one all-to-all over the group. It needs ``sp``: under sequence parallelism each
  device of ``model`` holds its own slice of every sequence between blocks, so the tokens of
  the group's devices are distinct (Megatron-LM requires ``--sequence-parallel`` with
  tensor and expert parallelism); the zoo's Qwen3-235B layout is ``zero1_ep_fold_sp``.

Pipeline stages and their virtual stages are a fifth dimension, the plan's ``stages`` and
``virtual_stages`` (a leading ``stage`` mesh axis), orthogonal to all four.

The naming rule: a strategy's name is its parts in the order data, expert, tensor, context,
joined by ``_``, each left out where the dimension is off (``data=none``, ``tensor=none``):
``zero1_sp_cp`` is ZeRO-1 x tensor-and-sequence parallel x context parallel, ``ep_tp`` expert x
tensor parallel; all four off is ``replicated``. The ring form of context parallelism adds
``ring`` after ``cp`` (``zero1_sp_cp_ring``); ``cp`` alone is the all-gather form, as it was
before the ring. The folded form of expert parallelism adds ``fold`` after ``ep``
(``zero1_ep_fold_sp``); ``ep`` alone keeps its meaning (the experts over ``expert`` only).
Today's names are exactly the compositions of their parts
(:func:`shardscope._src.sharding.strategies.compose` builds every strategy).

>>> Parallelism.parse("zero1_sp_cp")  # doctest: +ELLIPSIS
Parallelism(data='zero1', tensor='sp', context=True, expert=False, context_comm='all_gather', ...)
>>> Parallelism.parse("dp_cp_ring").context_comm
'ring'
>>> Parallelism(DataParallel.FSDP, Tensor.TP).name
'fsdp_tp'
>>> Parallelism().name, Parallelism(expert=True, tensor=Tensor.TP).name
('replicated', 'ep_tp')
>>> Parallelism.parse("zero1_ep_fold_sp").expert_fold
True
>>> Parallelism.parse("zero1_ep_sp").expert_fold, Parallelism.parse("zero1_ep_sp").tensor
(False, 'sp')
>>> Parallelism(DataParallel.ZERO1, context=True, expert=True, context_comm="ring").name
'zero1_ep_cp_ring'
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardscope._src.base.errors import StrategyError
from shardscope._src.base.vocab import Vocab


class DataParallel(Vocab):
    """How the devices that split the batch hold the model state."""

    #: no data axis: every device sees the whole batch (other axes replicate)
    NONE = "none"
    #: the model state replicated, the gradients all-reduced
    DP = "dp"
    #: ZeRO-1 (Megatron-LM's distributed optimizer): the optimizer state sharded
    ZERO1 = "zero1"
    #: ZeRO-2: the gradients and the optimizer state sharded
    ZERO2 = "zero2"
    #: fully sharded: the parameters too, gathered at use
    FSDP = "fsdp"
    #: hybrid sharded: FSDP over ``data``, replicated over ``replica``
    HSDP = "hsdp"


class Tensor(Vocab):
    """Tensor parallelism over the ``model`` axis."""

    NONE = "none"
    #: Megatron's column- and row-parallel projections
    TP = "tp"
    #: tensor parallel with the residual stream's sequence split between blocks
    SP = "sp"


class ContextComm(Vocab):
    """How context parallelism exchanges the keys and values of the sequence's shards."""

    #: each layer all-gathers the whole sequence's keys and values (the default)
    ALL_GATHER = "all_gather"
    #: each device passes its chunk of them around a ring, ``c - 1`` steps a layer
    RING = "ring"


#: The name's part for a context- and an expert-parallel dimension.
CONTEXT_PART = "cp"
#: The part after ``cp`` for the ring form of context parallelism.
RING_PART = "ring"
EXPERT_PART = "ep"
#: The part after ``ep`` for its folded form (the experts over ``expert x model``, whole).
FOLD_PART = "fold"
#: The name of the strategy with every dimension off.
REPLICATED = "replicated"

#: The data flavours expert parallelism composes with (with any tensor choice, together
#: too): the dense weights' data-parallel group is the data and the expert axes, the routed
#: experts' the data axes (Megatron-LM's expert data parallelism).
EXPERT_DATA = (
    DataParallel.NONE,
    DataParallel.DP,
    DataParallel.ZERO1,
    DataParallel.ZERO2,
    DataParallel.FSDP,
)


@dataclass(frozen=True)
class Parallelism:
    """One choice along each dimension (see the module docstring); :attr:`name` is the
    strategy's name, :meth:`parse` reads one back.

    Raises :class:`StrategyError` for a combination the rule sets do not compose: expert
    parallelism with HSDP, folded without sequence parallelism or with context parallelism.

    >>> Parallelism.parse("zero1_ep_tp").expert, Parallelism.parse("zero1_ep_tp").expert_fold
    (True, False)
    """

    data: DataParallel = DataParallel.NONE
    tensor: Tensor = Tensor.NONE
    context: bool = False
    expert: bool = False
    #: how the context shards exchange keys and values (only with ``context``)
    context_comm: ContextComm = ContextComm.ALL_GATHER
    #: expert parallelism folded over ``model`` (only with ``expert`` and ``sp``): the
    #: experts over ``expert x model``, each whole (ETP 1), where unfolded they are over
    #: ``expert`` and their hidden over ``model``
    expert_fold: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "data", DataParallel.parse(self.data, error=StrategyError))
        object.__setattr__(self, "tensor", Tensor.parse(self.tensor, error=StrategyError))
        object.__setattr__(
            self,
            "context_comm",
            ContextComm.parse(self.context_comm, what="context_comm", error=StrategyError),
        )
        if self.context_comm == ContextComm.RING and not self.context:
            raise StrategyError(
                f"context_comm={self.context_comm.value!r} is a form of context parallelism, "
                f"and context=False; give context=True (a name's '{CONTEXT_PART}_"
                f"{RING_PART}'), or context_comm='all_gather'"
            )
        if self.context_comm == ContextComm.RING and self.data == DataParallel.HSDP:
            # its train step maps the replicas by a vmap, inside which the ring's shard_map
            # over the context axis does not compile
            raise StrategyError(
                f"{self.name}: the ring form of context parallelism is not built under HSDP; "
                f"choose {self.name.removesuffix('_' + RING_PART)} (the all-gather form) or "
                f"the ring under fsdp, zero1, zero2 or dp"
            )
        if self.expert_fold and not (self.expert and self.tensor == Tensor.SP):
            fix = replace(self, expert=True, tensor=Tensor.SP)
            unfolded = replace(self, expert_fold=False)
            why = (
                "is a form of expert parallelism, and expert=False"
                if not self.expert
                else "takes sequence parallelism (sp: each device of 'model' holds its own "
                "slice of the sequence, so the tokens the group's devices send are distinct, "
                "as Megatron-LM requires --sequence-parallel with tensor and expert "
                "parallelism)"
            )
            raise StrategyError(
                f"{self.name}: folding the experts over 'expert' x 'model' ({FOLD_PART}) "
                f"{why}; choose {fix.name}, or {unfolded.name} without folding"
            )
        if self.expert_fold and self.context:
            fix = replace(self, context=False, context_comm=ContextComm.ALL_GATHER)
            raise StrategyError(
                f"{self.name}: the folded form of expert parallelism ({FOLD_PART}) is not "
                f"built with context parallelism; choose {fix.name} (folded, no context "
                f"parallelism) or {replace(self, expert_fold=False).name} (the experts over "
                f"'{EXPERT_PART}' alone, each context shard's tokens routed as their own group)"
            )
        if self.expert and self.data not in EXPERT_DATA:
            data = "/".join(d.value for d in EXPERT_DATA if d != DataParallel.NONE)
            fix = replace(self, data=DataParallel.FSDP)
            raise StrategyError(
                f"{self.name}: expert parallelism composes with data parallelism ({data}), "
                f"with tensor parallelism (tp, sp, or sp folded: {EXPERT_PART}_{FOLD_PART}_sp) "
                f"and with context parallelism ({CONTEXT_PART}, {CONTEXT_PART}_{RING_PART}), "
                f"and not with HSDP; choose e.g. {fix.name}, or "
                f"{replace(self, expert=False, expert_fold=False).name} without expert "
                f"parallelism (a dense model's)"
            )

    @property
    def name(self) -> str:
        """The strategy's name: its parts in the order data, expert, tensor, context (and
        ``ring`` after ``cp`` for the ring form, ``fold`` after ``ep`` for the folded one)."""
        parts = [
            *([self.data.value] if self.data != DataParallel.NONE else []),
            *([EXPERT_PART] if self.expert else []),
            *([FOLD_PART] if self.expert_fold else []),
            *([self.tensor.value] if self.tensor != Tensor.NONE else []),
            *([CONTEXT_PART] if self.context else []),
            *([RING_PART] if self.context_comm == ContextComm.RING else []),
        ]
        return "_".join(parts) or REPLICATED

    @classmethod
    def parse(cls, name: str) -> Parallelism:
        """The dimensions of a strategy name written by the naming rule; a
        :class:`StrategyError` names the part that does not read and the rule."""
        if name == REPLICATED:
            return cls()
        parts = name.split("_") if isinstance(name, str) else [repr(name)]
        data, tensor, expert, context = DataParallel.NONE, Tensor.NONE, False, False
        comm, fold = ContextComm.ALL_GATHER, False
        # each part in its slot, the slots in order: data, expert, fold, tensor, context, ring
        slot = 0
        for part in parts:
            got = DataParallel.get(part) if slot < 1 else None
            if got is not None and got != DataParallel.NONE:
                data, slot = got, 1
            elif part == EXPERT_PART and slot < 2:
                expert, slot = True, 2
            elif part == FOLD_PART and slot == 2:
                fold, slot = True, 3
            elif Tensor.get(part) not in (None, Tensor.NONE) and slot < 4:
                tensor, slot = Tensor.parse(part), 4
            elif part == CONTEXT_PART and slot < 5:
                context, slot = True, 5
            elif part == RING_PART and slot == 5:
                comm, slot = ContextComm.RING, 6
            else:
                raise StrategyError(
                    f"unknown strategy {name!r}: a strategy is named by its parts in the order "
                    f"data ({', '.join(d for d in DataParallel if d != DataParallel.NONE)}), "
                    f"{EXPERT_PART} (or {EXPERT_PART}_{FOLD_PART}, its folded form), tensor "
                    f"(tp or sp), {CONTEXT_PART} (or {CONTEXT_PART}_{RING_PART}, its ring "
                    f"form), joined by '_' (e.g. zero1_sp_cp), or {REPLICATED}; {part!r} does "
                    f"not read there"
                )
        return cls(data, tensor, context, expert, comm, fold)
