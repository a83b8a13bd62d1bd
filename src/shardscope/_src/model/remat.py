"""Recomputation by named tensor: the reference decoder's named activations and a
:class:`RematPolicy` saying, for each, whether the backward pass finds it in device memory,
in host memory (offloaded after the forward and fetched back) or computes it again.

A policy is written as one of (:func:`remat_policy` reads them):

* today's five words, presets of the named tensors: ``none``, ``selective``, ``matmuls``,
  ``full``, ``offload`` (:class:`~shardscope._src.model.config.Remat`);
* ``maxtext:NAME`` (or the bare ``NAME`` where it is no word above), one of MaxText's
  ``remat_policy`` values, mapped name for name from ``Decoder.get_remat_policy`` in
  ``MaxText/layers/decoders.py`` (AI-Hypercomputer/maxtext): ``minimal``,
  ``minimal_with_context`` (``minimal_flash``), ``save_dot_with_context_except_mlp``,
  ``save_dot_except_mlpwi``, ``save_dot_except_mlp``, ``save_qkv_proj``,
  ``qkv_proj_offloaded``, ``minimal_offloaded``, ``save_out_proj``, ``full``;
* ``jax:NAME``, a policy of ``jax.checkpoint_policies`` that names no tensor:
  ``offload_dot_with_no_batch_dims``, and those that are a preset exactly, read as it:
  ``nothing_saveable`` (``full``), ``everything_saveable`` (``none``),
  ``dots_with_no_batch_dims_saveable`` and ``checkpoint_dots_with_no_batch_dims``
  (``matmuls``); ``maxtext:full`` (``jax.checkpoint`` with no policy) is ``full`` too;
* ``custom:TENSOR=PLACE,TENSOR=PLACE,...``, MaxText's ``remat_policy=custom`` (its
  ``base.yml`` sets each tensor to ``device``, ``offload`` or ``remat``; ``recompute`` here,
  ``remat`` read as it): a tensor left out is recomputed, but the layer's input, which is
  kept on the device (MaxText: "this tensor cannot be rematerialized - it serves as periodic
  checkpoints"). The decoder's tensors are :data:`TENSORS`; ``qkv_proj`` and ``mlpwi`` are
  MaxText's names of its fused projections (``fused_qkv``, ``fused_mlp``), read as the three
  projections and as the MLP's gate and up, ``mlpwi_0`` and ``mlpwi_1`` (MaxText's names of
  its separate ones, which the decoder computes as two matmuls, as MaxText does by default;
  a GELU MLP's one up-projection is ``mlpwi_0``, which MaxText calls ``mlpwi``: ``mlpwi``
  means it for either);
* ``megatron:MODULE,MODULE,...``, Megatron-Core's selective recomputation
  (``--recompute-granularity selective --recompute-modules ...``, its config's
  ``recompute_modules``; ``megatron/core/transformer/transformer_config.py``): every named
  tensor kept on the device but the outputs of the modules it lists, which the backward
  computes again (:data:`MEGATRON_MODULES`); ``megatron:selective`` is Megatron's default
  list, ``core_attn``.

A named policy compiles with ``jax.checkpoint_policies.save_and_offload_only_these_names``
(the decoder calls ``checkpoint_name`` on every tensor of :data:`TENSORS`), so what the
compiled program keeps is what the policy says; the presets compile as they always have
(:attr:`RematPolicy.compiled_as`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardscope._src.base.errors import RecordError, ShardscopeError
from shardscope._src.base.records import Record, field_of
from shardscope._src.base.vocab import Vocab


class Place(Vocab):
    """Where the backward pass finds a named tensor."""

    #: kept in device memory from the forward
    DEVICE = "device"
    #: copied to host memory during the forward and back for the backward
    OFFLOAD = "offload"
    #: computed again from what is kept (MaxText writes ``remat``)
    RECOMPUTE = "recompute"


#: The reference decoder's named tensors of one layer, in the order the forward makes them,
#: each the name ``checkpoint_name`` gives it (MaxText's where MaxText has one).
TENSORS: dict[str, str] = {
    "decoder_layer_input": "the layer's input, the residual stream",
    "pre_self_attention_norm": "the attention's normed input",
    "query_proj": "the query projection",
    "key_proj": "the key projection",
    "value_proj": "the value projection",
    "context": "the attention's output, the out-projection's input",
    "out_proj": "the attention's out-projection",
    "post_self_attention_norm": "the MLP's normed input",
    "expert_input": "the routed experts' input, each slot's token as the dispatch delivers it",
    "mlpwi_0": "the MLP's gate projection (SwiGLU's; GELU's one up-projection)",
    "mlpwi_1": "the MLP's up projection (SwiGLU's; a GELU MLP has none)",
    "mlp_act": "the MLP's activation, act(gate) x up (a mixture's shared experts' too)",
    "expert_act": "the routed experts' activation, act(gate) x up over their slots",
    "mlpwo": "the MLP's down-projection",
}
#: MaxText's names for several of the decoder's tensors at once: its fused projections
#: (``fused_qkv``, ``fused_mlp``): the query, key and value, and the MLP's gate and up (a GELU
#: MLP's one up-projection, which MaxText names ``mlpwi`` too).
GROUPS: dict[str, tuple[str, ...]] = {
    "qkv_proj": ("query_proj", "key_proj", "value_proj"),
    "mlpwi": ("mlpwi_0", "mlpwi_1"),
}
#: The tensor every policy keeps (the layer loop's checkpoint), on the device unless offloaded.
LAYER_INPUT = "decoder_layer_input"
#: The matmuls that make the named tensors, each run again when any of its outputs is
#: recomputed: the fused query, key and value projection, the attention core (``QK^T`` and
#: ``PV``), the out-projection, the MLP's gate and up (each its own matmul: GELU's one
#: up-projection is ``mlp_in_0``, and it has no ``mlp_in_1``) and its down-projection.
PRODUCERS: dict[str, tuple[str, ...]] = {
    "qkv": ("query_proj", "key_proj", "value_proj"),
    "core": ("context",),
    "out": ("out_proj",),
    "mlp_in_0": ("mlpwi_0",),
    "mlp_in_1": ("mlpwi_1",),
    "mlp_out": ("mlpwo",),
}
#: The projections' matmuls (:data:`PRODUCERS` but the attention core).
PROJECTIONS = ("qkv", "out", "mlp_in_0", "mlp_in_1", "mlp_out")
#: The MLP's up-projections' matmuls (SwiGLU's gate and up, GELU's one).
MLP_IN = ("mlp_in_0", "mlp_in_1")


class CompiledAs(Vocab):
    """The ``jax.checkpoint_policies`` policy a :class:`RematPolicy` compiles with."""

    #: no ``jax.checkpoint`` at all (``everything_saveable``)
    EVERYTHING = "everything_saveable"
    #: ``save_anything_except_these_names`` of the attention scores and probabilities
    EXCEPT_SCORES = "save_anything_except_these_names"
    NOTHING = "nothing_saveable"
    DOTS = "dots_with_no_batch_dims_saveable"
    OFFLOAD_DOTS = "offload_dot_with_no_batch_dims"
    #: ``save_and_offload_only_these_names`` of the policy's tensors on device and offloaded
    NAMES = "save_and_offload_only_these_names"


@dataclass(frozen=True)
class RematPolicy(Record):
    """Where each of the decoder's named tensors (:data:`TENSORS`) is for the backward.

    ``name`` is the policy as written, canonical (``"full"``, ``"maxtext:save_qkv_proj"``,
    ``"custom:decoder_layer_input=offload,query_proj=offload"``); ``places`` every tensor's
    :class:`Place`, in :data:`TENSORS` order; ``compiled_as`` the JAX policy the program
    compiles with; ``source`` where its definition comes from.

    ``none`` and ``selective`` keep every activation the backward reads, named or not (but,
    for selective, the attention scores): their memory is Korthikanti et al.'s Table 2, not a
    sum of named tensors (:attr:`keeps_everything`).

    >>> p = remat_policy("maxtext:save_dot_except_mlpwi")
    >>> p.recomputed[:4]
    ('pre_self_attention_norm', 'context', 'post_self_attention_norm', 'expert_input')
    >>> p.rerun_producers()  # the attention core and the MLP's gate and up run again
    ('core', 'mlp_in_0', 'mlp_in_1')
    >>> remat_policy("custom:query_proj=offload,key_proj=offload").offloaded
    ('query_proj', 'key_proj')
    """

    name: str
    places: tuple[tuple[str, Place], ...]
    compiled_as: CompiledAs
    source: str

    def place(self, tensor: str) -> Place:
        return dict(self.places)[tensor]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RematPolicy:
        """The policy :meth:`to_dict` wrote. A place of a group (:data:`GROUPS`) is each of
        its tensors': a record written when the MLP's gate and up were one tensor places
        ``mlpwi``, read as both.

        Raises:
            RecordError: a field missing, a place that is no :class:`Place`, a tensor the
                decoder does not name, or one left without a place.
        """
        what = "a recomputation policy"
        places: dict[str, Place] = {}
        for tensor, word in field_of(data, "places", what):
            if tensor not in TENSORS and tensor not in GROUPS:
                raise RecordError(f"{what} places {tensor!r}, which the decoder does not "
                                  f"name; it names {_named()}")  # fmt: skip
            place = Place.parse(word, what=f"{what}'s place of {tensor}", error=RecordError)
            places.update(dict.fromkeys(GROUPS.get(tensor, (tensor,)), place))
        if missing := [t for t in TENSORS if t not in places]:
            raise RecordError(f"{what} places none of {', '.join(missing)}; write it again "
                              f"with this shardscope")  # fmt: skip
        return cls(
            str(field_of(data, "name", what)),
            tuple((t, places[t]) for t in TENSORS),
            CompiledAs.parse(field_of(data, "compiled_as", what), error=RecordError),
            str(field_of(data, "source", what)),
        )

    def _with(self, place: Place) -> tuple[str, ...]:
        return tuple(t for t, p in self.places if p == place)

    # The policies are made once a name (remat_policy) and the screen asks these of every
    # candidate: each is worked out once a policy.
    @functools.cached_property
    def on_device(self) -> tuple[str, ...]:
        """The tensors kept in device memory (the layer's input among them unless offloaded)."""
        return self._with(Place.DEVICE)

    @functools.cached_property
    def offloaded(self) -> tuple[str, ...]:
        return self._with(Place.OFFLOAD)

    @functools.cached_property
    def recomputed(self) -> tuple[str, ...]:
        return self._with(Place.RECOMPUTE)

    @property
    def keeps_everything(self) -> bool:
        """Whether it keeps every activation the backward reads, named or not (``none``,
        ``selective``; JAX's ``everything_saveable``)."""
        return self.compiled_as in (CompiledAs.EVERYTHING, CompiledAs.EXCEPT_SCORES)

    @property
    def recomputes_nothing(self) -> bool:
        """``none``: no ``jax.checkpoint`` around the layer."""
        return self.compiled_as == CompiledAs.EVERYTHING

    def rerun_producers(self) -> tuple[str, ...]:
        """The matmuls of :data:`PRODUCERS` the backward runs again: those with an output
        recomputed (none for a policy that keeps everything)."""
        return self._rerun_producers

    @functools.cached_property
    def _rerun_producers(self) -> tuple[str, ...]:
        if self.keeps_everything:
            return ()
        gone = set(self.recomputed)
        return tuple(op for op, outs in PRODUCERS.items() if gone & set(outs))

    @functools.cached_property
    def reruns_forward_collectives(self) -> bool:
        """Whether the backward runs the forward's collectives again: the out-projection or
        the MLP's down-projection computed again (their outputs end in the tensor-parallel
        reductions; full recomputation, offload)."""
        rerun = self.rerun_producers()
        return "out" in rerun or "mlp_out" in rerun

    @functools.cached_property
    def keeps_only_input(self) -> bool:
        """Whether it keeps nothing but the layer's input (on the device or offloaded): the
        backward runs the whole layer's forward again."""
        return not self.keeps_everything and set(self.recomputed) == set(TENSORS) - {LAYER_INPUT}

    def compiled_names(self, place: Place) -> tuple[str, ...]:
        """The ``checkpoint_name`` names the compiled program saves (``place`` device) or
        offloads: the tensors in ``place``, the query, key and value as the fused
        ``qkv_proj`` when all three are there, and the layer's input only when offloaded
        (on the device, the layer loop keeps it)."""
        names = [t for t in self._with(place) if not (t == LAYER_INPUT and place == Place.DEVICE)]
        qkv = GROUPS["qkv_proj"]
        if all(t in names for t in qkv):
            names = [n for n in names if n not in qkv[1:]]
            names[names.index(qkv[0])] = "qkv_proj"
        return tuple(names)


def _places(device: tuple[str, ...] = (), offload: tuple[str, ...] = ()) -> tuple[Any, ...]:
    out = []
    for t in TENSORS:
        place = Place.RECOMPUTE
        if t in device or t == LAYER_INPUT:
            place = Place.DEVICE
        if t in offload:
            place = Place.OFFLOAD
        out.append((t, place))
    return tuple(out)


_QKV = ("query_proj", "key_proj", "value_proj")
_MLPWI = GROUPS["mlpwi"]
_DOTS = (*_QKV, "out_proj", *_MLPWI, "mlpwo")
_ALL = tuple(TENSORS)
_SHARDSCOPE = "shardscope's preset"
_MAXTEXT = "MaxText remat_policy={} (MaxText/layers/decoders.py, Decoder.get_remat_policy)"
_JAX = "jax.checkpoint_policies.{}"

#: Today's five words, as named tensors: (on the device, offloaded, compiled as, source).
_PRESETS: dict[str, tuple[tuple[str, ...], tuple[str, ...], CompiledAs, str]] = {
    "none": (_ALL, (), CompiledAs.EVERYTHING, _SHARDSCOPE + ": every activation kept"),
    "selective": (
        _ALL,
        (),
        CompiledAs.EXCEPT_SCORES,
        _SHARDSCOPE + ": all but the attention scores (Korthikanti et al., arXiv 2205.05198)",
    ),
    "matmuls": (
        _DOTS,
        (),
        CompiledAs.DOTS,
        _SHARDSCOPE + ": the matmul outputs kept (JAX's dots_with_no_batch_dims_saveable)",
    ),
    "full": ((), (), CompiledAs.NOTHING, _SHARDSCOPE + ": only the layer's input kept"),
    "offload": (
        (),
        (LAYER_INPUT, *_QKV),
        CompiledAs.NAMES,
        _SHARDSCOPE + ": the input and the query, key and value in host memory",
    ),
}
#: MaxText's policies (``Decoder.get_remat_policy``), as the names they save and offload;
#: MaxText's ``kv_proj`` (latent attention) and ``quantization`` the decoder does not have.
_MAXTEXT_POLICIES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "minimal": (_DOTS, ()),
    "minimal_with_context": ((*_DOTS, "context"), ()),
    "save_dot_with_context_except_mlp": ((*_QKV, "context", "out_proj"), ()),
    "save_dot_except_mlpwi": ((*_QKV, "out_proj", "mlpwo"), ()),
    "save_dot_except_mlp": ((*_QKV, "out_proj"), ()),
    "save_qkv_proj": (_QKV, ()),
    "qkv_proj_offloaded": ((), _QKV),
    "minimal_offloaded": ((), _DOTS),
    "save_out_proj": (("out_proj",), ()),
}
_MAXTEXT_ALIASES = {"minimal_flash": "minimal_with_context"}
#: jax.checkpoint_policies that name no tensor, as the presets they are.
_JAX_POLICIES: dict[str, tuple[tuple[str, ...], tuple[str, ...], CompiledAs]] = {
    "offload_dot_with_no_batch_dims": ((), _DOTS, CompiledAs.OFFLOAD_DOTS),
}
#: Names that are a preset exactly (the same JAX policy): read as the preset.
_SAME_AS = {
    "maxtext:full": "full",  # MaxText's full is jax.checkpoint with policy=None
    "jax:nothing_saveable": "full",
    "jax:everything_saveable": "none",
    "jax:dots_with_no_batch_dims_saveable": "matmuls",
    "jax:checkpoint_dots_with_no_batch_dims": "matmuls",
}
_PLACE_WORDS = {"device": Place.DEVICE, "offload": Place.OFFLOAD, "recompute": Place.RECOMPUTE}
_PLACE_WORDS["remat"] = Place.RECOMPUTE  # MaxText's word

#: Megatron-Core's ``recompute_modules`` (in its own order) and the decoder's named tensors
#: each recomputes. ``core_attn``: the attention core, whose scores and probabilities no
#: policy by named tensor keeps (the blocked core keeps nothing but its output and
#: log-sum-exp, kept); ``layernorm``: ``input_layernorm`` and ``pre_mlp_layernorm``'s
#: outputs; ``mla_up_proj``: latent attention's query, keys and values made from the latents
#: (the up-projections and the rotary part); ``mlp``: a dense MLP but its input; ``moe_act``:
#: the routed experts' activation; ``moe``: a layer with experts' MLP but its input
#: (dispatched slots, experts, shared experts). ``moe_act``, ``layernorm`` and
#: ``mla_up_proj`` discard their outputs; the others keep their inputs (normal
#: checkpointing), whose outputs no backward reads.
MEGATRON_MODULES: dict[str, tuple[str, ...]] = {
    "core_attn": (),
    "moe_act": ("expert_act",),
    "layernorm": ("pre_self_attention_norm", "post_self_attention_norm"),
    "mla_up_proj": ("query_proj", "key_proj", "value_proj"),
    "mlp": (*_MLPWI, "mlp_act", "mlpwo"),
    "moe": ("expert_input", *_MLPWI, "mlp_act", "expert_act", "mlpwo"),
}
#: Megatron-Core's default ``recompute_modules`` (``selective`` with no list).
MEGATRON_DEFAULT = ("core_attn",)
#: Megatron's modules the decoder cannot recompute on their own, and why.
_MEGATRON_UNNAMED = {
    "shared_experts": "the decoder names the shared experts' projections as the routed "
    "experts' (mlpwi_0, mlpwi_1, mlpwo); write moe (the whole MLP of a layer with experts) instead",
}
_MEGATRON = "Megatron-Core recompute_granularity=selective, recompute_modules=[{}]"

#: Every policy name :func:`remat_policy` takes but ``custom:``, for error messages and docs.
POLICY_NAMES: tuple[str, ...] = (
    *_PRESETS,
    *(f"maxtext:{n}" for n in _MAXTEXT_POLICIES),
    "maxtext:full",
    *(f"jax:{n}" for n in _JAX_POLICIES),
    *(n for n in _SAME_AS if n.startswith("jax:")),
    "megatron:selective",
)


def _bad(value: str, why: str) -> ShardscopeError:
    return ShardscopeError(f"remat={value!r}: {why}", param="remat")


def _named() -> str:
    return ", ".join([*TENSORS, *GROUPS])


def _custom(value: str, body: str) -> RematPolicy:
    places: dict[str, Place] = {}
    for item in body.split(","):
        tensor, sep, word = (s.strip() for s in item.partition("="))
        if not sep or not tensor:
            raise _bad(value, f"{item.strip()!r} is not TENSOR=PLACE; write e.g. custom:"
                       f"query_proj=offload,out_proj=device")  # fmt: skip
        if tensor not in TENSORS and tensor not in GROUPS:
            raise _bad(value, f"the reference decoder has no tensor {tensor!r}; it names "
                       f"{_named()}")  # fmt: skip
        place = _PLACE_WORDS.get(word)
        if place is None:
            raise _bad(value, f"{tensor}={word!r}: place it on device, offload or recompute "
                       f"(MaxText's remat)")  # fmt: skip
        for t in GROUPS.get(tensor, (tensor,)):
            if places.get(t, place) != place:
                group = f", and {tensor} stands for {', '.join(GROUPS[tensor])}" \
                    if tensor in GROUPS else ""  # fmt: skip
                raise _bad(value, f"{t} is placed twice, {places[t]} and {place} ({tensor}="
                           f"{word}{group}); give it one place")  # fmt: skip
            places[t] = place
    if places.get(LAYER_INPUT) == Place.RECOMPUTE:
        raise _bad(value, f"{LAYER_INPUT} cannot be recomputed: it is the layer loop's "
                   f"checkpoint, where recomputation starts; give device or offload")  # fmt: skip
    full = tuple(
        (t, places.get(t, Place.DEVICE if t == LAYER_INPUT else Place.RECOMPUTE)) for t in TENSORS
    )
    return RematPolicy(
        f"custom:{_written(full)}",
        full,
        CompiledAs.NAMES,
        "MaxText remat_policy=custom (its base.yml: each tensor device, offload or remat)",
    )


def _written(places: tuple[tuple[str, Place], ...]) -> str:
    """A custom policy's canonical body: each tensor not in its default place, in
    :data:`TENSORS` order, the MLP's gate and up as ``mlpwi`` where they share one (as
    written before they were named apart)."""
    default = dict(_places())
    by = dict(places)
    gate, up = GROUPS["mlpwi"]
    items = []
    for t, p in places:
        if p == default[t] or (t == up and by[gate] == p):
            continue
        items.append(f"mlpwi={p}" if t == gate and by[up] == p else f"{t}={p}")
    return ",".join(items) or f"{LAYER_INPUT}=device"


def _megatron(value: str, body: str) -> RematPolicy:
    modules: set[str] = set()
    for item in (s.strip() for s in body.split(",")):
        if item == "selective":
            modules.update(MEGATRON_DEFAULT)
        elif item in MEGATRON_MODULES:
            modules.add(item)
        elif item in _MEGATRON_UNNAMED:
            raise _bad(value, f"{item}: {_MEGATRON_UNNAMED[item]}")
        else:
            raise _bad(value, f"{item!r} is no module Megatron recomputes here; list among "
                       f"{', '.join(MEGATRON_MODULES)}, or write megatron:selective (its "
                       f"default, core_attn)")  # fmt: skip
    listed = tuple(m for m in MEGATRON_MODULES if m in modules)
    again = {t for m in listed for t in MEGATRON_MODULES[m]}
    device = tuple(t for t in TENSORS if t not in again)
    source = _MEGATRON.format(", ".join(repr(m) for m in listed))
    return RematPolicy(f"megatron:{','.join(listed)}", _places(device), CompiledAs.NAMES, source)


def megatron_modules(policy: RematPolicy) -> tuple[str, ...]:
    """The Megatron modules a ``megatron:`` policy recomputes (none for another policy).

    >>> megatron_modules(remat_policy("megatron:layernorm, moe_act"))
    ('moe_act', 'layernorm')
    """
    prefix, _, body = policy.name.partition(":")
    return tuple(body.split(",")) if prefix == "megatron" else ()


@functools.cache
def remat_policy(name: str) -> RematPolicy:
    """The policy written ``name`` (see the module docstring for the forms it takes).

    Raises:
        ShardscopeError: a name that is none of them, or a custom policy naming a tensor the
            decoder does not have, a place that is not device, offload or recompute, or the
            layer's input recomputed; the message names the value and what is accepted.

    >>> remat_policy("save_qkv_proj").name
    'maxtext:save_qkv_proj'
    >>> remat_policy("offload").offloaded
    ('decoder_layer_input', 'query_proj', 'key_proj', 'value_proj')
    """
    if not isinstance(name, str):
        raise _bad(repr(name), "give a policy's name")
    text = name.strip()
    prefix, sep, rest = text.partition(":")
    if not sep:
        prefix, rest = ("" if text in _PRESETS else "maxtext"), text
    if f"{prefix}:{rest}" in _SAME_AS:
        prefix, rest = "", _SAME_AS[f"{prefix}:{rest}"]
    if prefix == "" and rest in _PRESETS:
        device, offload, compiled, source = _PRESETS[rest]
        return RematPolicy(rest, _places(device, offload), compiled, source)
    if prefix == "maxtext":
        key = _MAXTEXT_ALIASES.get(rest, rest)
        if key in _MAXTEXT_POLICIES:
            device, offload = _MAXTEXT_POLICIES[key]
            source = _MAXTEXT.format(key)
            return RematPolicy(f"maxtext:{key}", _places(device, offload), CompiledAs.NAMES, source)
        if key == "custom":
            raise _bad(name, "MaxText's custom policy is written custom:TENSOR=PLACE,...")
    if prefix == "jax":
        key = rest
        if key in _JAX_POLICIES:
            device, offload, compiled = _JAX_POLICIES[key]
            return RematPolicy(f"jax:{key}", _places(device, offload), compiled, _JAX.format(key))
    if prefix == "custom":
        return _custom(name, rest)
    if prefix == "megatron":
        return _megatron(name, rest)
    raise _bad(
        name,
        f"choose one of {', '.join(POLICY_NAMES)}, custom:TENSOR=PLACE,... over the "
        f"decoder's tensors ({_named()}), or megatron:MODULE,... ({', '.join(MEGATRON_MODULES)})",
    )


#: The named tensors latent attention does not name: its query, keys and values are made
#: from latents (DeepSeek-V2, arXiv 2405.04434).
LATENT_UNNAMED = ("query_proj", "key_proj", "value_proj")
#: Megatron's modules only a model with routed experts, latent attention, or dense MLPs
#: alone has (a mixture's dense MLPs are named as its experts are).
_NEEDS_EXPERTS = ("moe_act", "moe")


def model_problem(policy: RematPolicy, *, experts: bool, latent: bool, gated: bool) -> str | None:
    """Why a model's layers cannot run ``policy`` (None: they can): a model with routed
    ``experts`` names its layers' tensors as the dense decoder does, the experts' gate, up
    and down-projections over the slots they fill as ``mlpwi_0``, ``mlpwi_1`` and ``mlpwo``
    (MaxText's MoE names), but its experts' matmuls are batched over the experts, which a
    policy by matmul (``matmuls``, ``jax:offload_dot_with_no_batch_dims``) does not keep;
    ``latent`` attention names none of :data:`LATENT_UNNAMED`; an MLP that is not ``gated``
    (GELU's) has one up-projection, ``mlpwi_0``, and no ``mlpwi_1`` to keep apart from it.

    >>> model_problem(remat_policy("custom:decoder_layer_input=offload,out_proj=offload"),
    ...               experts=True, latent=True, gated=True) is None
    True
    >>> model_problem(remat_policy("offload"), experts=False, latent=True, gated=True)[:62]
    'latent attention names no query_proj, key_proj, value_proj (it'
    >>> model_problem(remat_policy("custom:mlpwi_1=device"), experts=False, latent=False,
    ...               gated=False)[:58]
    'mlpwi_1=device: a GELU MLP has no up projection apart from'
    """
    gate, up = GROUPS["mlpwi"]
    apart = policy.place(up)
    if not gated and apart not in (Place.RECOMPUTE, policy.place(gate)):
        return (
            f"{up}={apart}: a GELU MLP has no up projection apart from its one up-projection, "
            f"{gate}; place {gate} (or mlpwi) instead"
        )
    if experts and policy.compiled_as in (CompiledAs.DOTS, CompiledAs.OFFLOAD_DOTS):
        return (
            f"a mixture of experts' routed experts run as matmuls batched over the experts, "
            f"which {policy.compiled_as} does not keep; name the tensors instead "
            f"(maxtext:minimal keeps the same ones by name, the experts' as mlpwi and mlpwo)"
        )
    modules = megatron_modules(policy)
    for m in modules:
        if m in _NEEDS_EXPERTS and not experts:
            return (
                f"{m} recomputes the routed experts' tensors and the model has no experts; "
                f"drop it (for a dense model list core_attn, layernorm, mlp)"
            )
        if m == "mlp" and experts:
            return (
                "mlp recomputes a dense MLP, and the decoder names a mixture's dense MLPs as "
                "its experts (mlpwi, mlpwo); write moe or moe_act"
            )
        if m == "mla_up_proj" and not latent:
            return "mla_up_proj recomputes latent attention's up-projections; the model has "\
                "none: drop it"  # fmt: skip
    placed = [t for t in LATENT_UNNAMED if latent and policy.place(t) != Place.RECOMPUTE]
    if placed and modules:
        return (
            f"latent attention names no {', '.join(placed)} (its query, keys and values are "
            f"made from latents): add mla_up_proj, which recomputes them"
        )
    if placed and policy.compiled_as == CompiledAs.NAMES:
        named = ", ".join(t for t in TENSORS if t not in LATENT_UNNAMED)
        return (
            f"latent attention names no {', '.join(placed)} (its query, keys and values are "
            f"made from latents): leave them recomputed (remat), or place {named}"
        )
    return None


def split_policies(text: str) -> list[str]:
    """The policies of a comma-separated list, a ``custom:`` or ``megatron:`` policy's own
    commas kept in it: ``"full,custom:query_proj=offload,key_proj=offload"`` and
    ``"megatron:moe_act,layernorm,offload"`` are two policies each."""
    out: list[str] = []
    for item in (s.strip() for s in text.split(",")):
        last = out[-1] if out else ""
        if last.startswith("custom:") and "=" in item and ":" not in item:
            out[-1] += f",{item}"
        elif last.startswith("megatron:") and item in {*MEGATRON_MODULES, *_MEGATRON_UNNAMED}:
            out[-1] += f",{item}"
        else:
            out.append(item)
    return out
