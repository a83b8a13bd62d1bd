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
  and torchtitan's do); it composes with every data flavour but HSDP and with ``tp``, both at
  once (Megatron-LM's TP x EP x DP with the distributed optimizer is ``zero1_ep_tp``), and
  not with context or sequence parallelism.

Pipeline stages and their virtual stages are a fifth dimension, the plan's ``stages`` and
``virtual_stages`` (a leading ``stage`` mesh axis), orthogonal to all four.

The naming rule: a strategy's name is its parts in the order data, expert, tensor, context,
joined by ``_``, each left out where the dimension is off (``data=none``, ``tensor=none``):
``zero1_sp_cp`` is ZeRO-1 x tensor-and-sequence parallel x context parallel, ``ep_tp`` expert x
tensor parallel; all four off is ``replicated``. The ring form of context parallelism adds
``ring`` after ``cp`` (``zero1_sp_cp_ring``); ``cp`` alone is the all-gather form, as it was
before the ring. Today's names are exactly the compositions of
their parts (:func:`shardscope._src.sharding.strategies.compose` builds every strategy).

>>> Parallelism.parse("zero1_sp_cp")
Parallelism(data='zero1', tensor='sp', context=True, expert=False, context_comm='all_gather')
>>> Parallelism.parse("dp_cp_ring").context_comm
'ring'
>>> Parallelism(DataParallel.FSDP, Tensor.TP).name
'fsdp_tp'
>>> Parallelism().name, Parallelism(expert=True, tensor=Tensor.TP).name
('replicated', 'ep_tp')
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
#: The name of the strategy with every dimension off.
REPLICATED = "replicated"

#: The data flavours expert parallelism composes with, and the tensor choices (together
#: too): the dense weights' data-parallel group is the data and the expert axes, the routed
#: experts' the data axes (Megatron-LM's expert data parallelism).
EXPERT_DATA = (
    DataParallel.NONE,
    DataParallel.DP,
    DataParallel.ZERO1,
    DataParallel.ZERO2,
    DataParallel.FSDP,
)
EXPERT_TENSOR = (Tensor.NONE, Tensor.TP)


@dataclass(frozen=True)
class Parallelism:
    """One choice along each dimension (see the module docstring); :attr:`name` is the
    strategy's name, :meth:`parse` reads one back.

    Raises :class:`StrategyError` for a combination the rule sets do not compose: expert
    parallelism with context parallelism, sequence parallelism or HSDP.

    >>> Parallelism.parse("zero1_ep_tp")
    Parallelism(data='zero1', tensor='tp', context=False, expert=True, context_comm='all_gather')
    """

    data: DataParallel = DataParallel.NONE
    tensor: Tensor = Tensor.NONE
    context: bool = False
    expert: bool = False
    #: how the context shards exchange keys and values (only with ``context``)
    context_comm: ContextComm = ContextComm.ALL_GATHER

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
        if self.expert and (
            self.context or self.data not in EXPERT_DATA or self.tensor not in EXPERT_TENSOR
        ):
            data = "/".join(d.value for d in EXPERT_DATA if d != DataParallel.NONE)
            fix = replace(
                self,
                data=self.data if self.data in EXPERT_DATA else DataParallel.FSDP,
                tensor=Tensor.TP if self.tensor != Tensor.NONE else Tensor.NONE,
                context=False,
            )
            raise StrategyError(
                f"{self.name}: expert parallelism composes with data parallelism ({data}) "
                f"and with tensor parallelism (tp), and not with context parallelism, "
                f"sequence parallelism (sp) or HSDP; choose e.g. {fix.name}, or "
                f"{replace(self, expert=False).name} without expert parallelism"
            )

    @property
    def name(self) -> str:
        """The strategy's name: its parts in the order data, expert, tensor, context (and
        ``ring`` after ``cp`` for the ring form)."""
        parts = [
            *([self.data.value] if self.data != DataParallel.NONE else []),
            *([EXPERT_PART] if self.expert else []),
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
        comm = ContextComm.ALL_GATHER
        # each part in its slot, the slots in order: data, expert, tensor, context, ring
        slot = 0
        for part in parts:
            got = DataParallel.get(part) if slot < 1 else None
            if got is not None and got != DataParallel.NONE:
                data, slot = got, 1
            elif part == EXPERT_PART and slot < 2:
                expert, slot = True, 2
            elif Tensor.get(part) not in (None, Tensor.NONE) and slot < 3:
                tensor, slot = Tensor.parse(part), 3
            elif part == CONTEXT_PART and slot < 4:
                context, slot = True, 4
            elif part == RING_PART and slot == 4:
                comm, slot = ContextComm.RING, 5
            else:
                raise StrategyError(
                    f"unknown strategy {name!r}: a strategy is named by its parts in the order "
                    f"data ({', '.join(d for d in DataParallel if d != DataParallel.NONE)}), "
                    f"{EXPERT_PART}, tensor (tp or sp), {CONTEXT_PART} (or {CONTEXT_PART}_"
                    f"{RING_PART}, its ring form), joined by '_' (e.g. zero1_sp_cp), or "
                    f"{REPLICATED}; {part!r} does not read there"
                )
        return cls(data, tensor, context, expert, comm)
