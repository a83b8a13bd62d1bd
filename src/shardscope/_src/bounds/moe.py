"""The least communication of a mixture-of-experts layer over an expert axis.

Top-k routing sends each token's activations to the devices of its ``k`` experts and brings
their outputs back: over an expert axis of ``e`` devices each holding ``experts / e`` experts
and ``tokens / e`` of the tokens, one all-to-all of the dispatched activations
(``tokens x k x d_model`` elements in all) and one of the combined outputs, per forward; the
backward sends their gradients the same two ways. Under uniform routing each device keeps
``1 / e`` of what it dispatches (its own experts' share) and sends the rest, which is what
an all-to-all of that whole array sends (:func:`~shardscope._src.base.comm.traffic_bytes`);
a routing whose busiest expert gets ``imbalance`` times its even share needs the buffers that
large, and so does a capacity-padded program with ``capacity_factor`` = ``imbalance``.

Where a device holds several experts, a token with two of its experts there needs to reach
it once, and their outputs can be summed there before they go back: sending each token once
to each device of its experts (``once``; DeepEP's dispatch and combine) moves ``e x share``
rows a token instead of ``k``, ``share`` the chance that a device holds one of its experts
(:func:`~shardscope._src.model.moe.device_share`, ``1 - C(E - E/e, k) / C(E, k)`` under
uniform routing), and which rows fill which experts' slots (4 bytes each) with their router
weights (at the activations' dtype), whose gradient the backward sends back. Across nodes
DeepEP sends those rows once to each node, which forwards them over its own links: the
terms say so (``Term.once_per_node``) and the links price it
(:func:`~shardscope._src.cost.links.exchange_bandwidth`).
"""

from __future__ import annotations

import math

from shardscope._src.base.comm import ALL_REDUCE, ALL_TO_ALL
from shardscope._src.base.errors import ModelConfigError, is_int
from shardscope._src.bounds.terms import Term, TermRole
from shardscope._src.model.moe import device_share

#: Bytes of a slot's row index (int32) on the wire.
INDEX_ITEMSIZE = 4


def _once_per_node(experts: int, top_k: int, group_limit: tuple[int, int]) -> tuple[int, ...]:
    """A sent-once all-to-all's routing for the links (:attr:`Term.once_per_node`): ``(experts,
    top_k)``, and the group limit where the routing has one."""
    return (experts, top_k) if group_limit[0] == group_limit[1] else (experts, top_k, *group_limit)


def moe_layer_terms(
    tokens: int,
    d_model: int,
    top_k: int,
    experts: int,
    axis: str | tuple[str, ...],
    expert_devices: int,
    itemsize: int,
    *,
    imbalance: float = 1.0,
    train: bool = False,
    data_axis: str | None = None,
    data_devices: int = 1,
    expert_weight_bytes: int = 0,
    once: bool = False,
    weight_activations: bool = False,
    group_limit: tuple[int, int] = (1, 1),
) -> tuple[Term, ...]:
    """The collectives one MoE layer needs over ``axis`` (``expert_devices`` devices, the
    tokens and the experts split over it; a tuple of axes for a group over several, as MoE
    parallel folding's ``expert`` and ``model``): the dispatch and the combine all-to-alls, each of
    ``ceil(imbalance x tokens x top_k) x d_model`` elements of ``itemsize`` bytes, forward
    (scopes ``moe/dispatch``, ``moe/combine``) and, with ``train``, again for their
    gradients in the backward, and the router's gradient (``d_model x experts``, replicated
    where the tokens are split) summed over ``axis``. Each expert's weights live on one
    device, so their gradients need no sum, unless a ``data_axis`` of ``data_devices``
    replicates the experts (expert x data parallelism: the tokens split over both, each
    replica's all-to-alls over ``axis`` alone): then each device's experts' gradients
    (``expert_weight_bytes``) are summed over it, and the router's over both axes. With
    ``once``, each token goes once to each device of its experts (see the module docstring):
    ``ceil(imbalance x tokens x e x share)`` rows each way (``share`` the routing's within
    its ``group_limit``: :func:`~shardscope._src.model.moe.device_share`), and the slots' routing
    (``ceil(imbalance x tokens x top_k)`` row indices of 4 bytes and router weights of
    ``itemsize``) with the dispatch, the weights' gradient back in the backward. With
    ``weight_activations`` (the experts scale their activations by the slots' router
    weights: Megatron-Core's all-to-all dispatcher sends the probabilities with the
    tokens), the router weights go with the slots (``ceil(imbalance x tokens x top_k)`` of
    ``itemsize``), their gradient back in the backward, as ``once`` sends them.

    >>> [t.payload_bytes for t in moe_layer_terms(256, 64, 2, 8, "expert", 8, 2)]
    [65536, 65536]

    Raises:
        ModelConfigError: a count that is not a positive whole number, or an imbalance
            below 1 (the busiest expert has at least its even share).
    """
    for name, value in (
        ("tokens", tokens),
        ("d_model", d_model),
        ("top_k", top_k),
        ("experts", experts),
        ("expert_devices", expert_devices),
        ("itemsize", itemsize),
    ):
        if not is_int(value, 1):
            raise ModelConfigError(f"{name}={value!r}: must be a positive whole number")
    if not (isinstance(imbalance, int | float) and imbalance >= 1):
        raise ModelConfigError(
            f"imbalance={imbalance!r}: the busiest expert's tokens over its even share, 1 or "
            f"more (1: uniform routing)"
        )
    if not is_int(data_devices, 1) or (data_devices > 1) != (data_axis is not None):
        raise ModelConfigError(
            f"data_devices={data_devices!r} with data_axis={data_axis!r}: give both (a data "
            f"axis of 2 or more devices) or neither"
        )
    if tokens % data_devices:
        raise ModelConfigError(f"tokens={tokens} do not split over {data_devices} replicas")
    if once and experts % expert_devices:
        raise ModelConfigError(
            f"experts={experts} do not split over expert_devices={expert_devices}; choose a "
            f"divisor of the experts"
        )
    # each replica's tokens go to its own copy of the experts
    replica = tokens // data_devices
    group = (axis,) if isinstance(axis, str) else tuple(axis)
    slots = math.ceil(imbalance * replica * top_k)
    share = device_share(experts, expert_devices, top_k, group_limit)
    rows = math.ceil(imbalance * replica * expert_devices * share) if once else slots
    payload = rows * d_model * itemsize
    passes = 2 if train else 1
    out = []
    for scope, what in (
        ("moe/dispatch", "each token's activations to its experts' devices"),
        ("moe/combine", "the experts' outputs back to their tokens"),
    ):
        out.append(
            Term(
                ALL_TO_ALL,
                group,
                expert_devices,
                payload,
                passes,
                what + (", forward and backward" if train else ""),
                scope,
                role=TermRole.ACTIVATION,
                once_per_node=_once_per_node(experts, top_k, group_limit) if once else (),
            )
        )
    # the slots' router weights go with them where the experts weight their activations (as
    # they do sent once), and which of a device's rows fills each slot where sent once
    routing = [("which of its rows fills each expert's slot", INDEX_ITEMSIZE)] if once else []
    if once or weight_activations:
        routing.append(("each expert slot's router weight", itemsize))
        for what, size in routing:
            out.append(
                Term(
                    ALL_TO_ALL,
                    group,
                    expert_devices,
                    slots * size,
                    1,
                    what,
                    "moe/dispatch",
                    role=TermRole.ACTIVATION,
                )
            )
        if train:
            what = "the gradient of the slots' router weights, back to their tokens"
            out.append(
                Term(
                    ALL_TO_ALL,
                    group,
                    expert_devices,
                    slots * itemsize,
                    1,
                    what,
                    "moe/dispatch",
                    role=TermRole.ACTIVATION,
                )  # fmt: skip
            )
    if train:
        axes = group if data_axis is None else (data_axis, *group)
        out.append(
            Term(
                ALL_REDUCE,
                axes,
                expert_devices * data_devices,
                d_model * experts * itemsize,
                1,
                "the router's gradient, summed over the devices that split the tokens",
                role=TermRole.GRADIENT_SUM,
            )
        )
        if data_axis is not None:
            out.append(
                Term(
                    ALL_REDUCE,
                    (data_axis,),
                    data_devices,
                    expert_weight_bytes,
                    1,
                    "each device's experts' gradients, summed over their replicas",
                    role=TermRole.GRADIENT_SUM,
                )
            )
    return tuple(out)
