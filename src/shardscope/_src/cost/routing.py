"""What a dropless mixture-of-experts layer does to route its tokens beyond its matmuls and
its all-to-alls: the one home of those costs, in bytes through HBM and in host waits.

* **the router's scores**: a fused score function and top-k (Megatron-Core's
  ``fused_topk_with_score_function``, ``moe_router_fusion``) reads each token's float32
  logits (``experts x 4`` bytes) and writes its float32 routing probabilities and a byte
  map of the experts it picked (``experts x (4 + 1)``); its backward reads the
  probabilities and their gradient and writes the logits' (``experts x 3 x 4``).
* **the permutation**: each token's row is read once and written to each of its slots
  (``top_k`` copies, times the routing's capacity: its imbalance), in expert order; the
  un-permutation reads each slot's row and writes each token's row once, the slots summed
  with their router weights (Transformer Engine's fused ``moe_permute`` and
  ``moe_unpermute``, which Megatron-Core runs with ``moe_permute_fusion``: one thread block
  a source token, its row loaded once, stored to each of its ``topK`` destinations, and
  back). Rows of ``d_model`` at the activations' dtype. Where the slots arrive over an
  expert axis in one chunk from each device and a device holds several experts, the
  all-to-all dispatcher sorts the received chunks by local expert, and back before the
  combine (Megatron-Core's ``sort_chunks_by_idxs``, MaxText's local permute after its
  ragged all-to-all): each a read and a write of every slot the device's experts take.
  Sending each token once to each device of its experts (DeepEP's dispatch), the receiving
  device permutes the rows it received into its experts' slots, and nothing is sorted.
  The backward runs the same moves the other way for the gradients (the permutation's
  backward is an un-permutation, and the reverse), and where the combine weights the
  experts' outputs by the router (not fused into the experts' activation) the router
  weights' gradient reads those outputs again. Recomputing the experts runs the forward's
  moves again.
* **priced once**: the slots the experts take and the outputs the combine weights are
  activations kept for the backward, and the step already moves each of those once
  written and once read, forward and backward (Korthikanti et al.'s count, as every kept
  activation: :func:`~shardscope._src.plan.estimates.moe_activation_bytes_per_layer`), as
  it moves the router's float32 logits: the routing's bytes are the moves beyond those
  (the experts' input written by the permutation, or by the sort where there is one, and
  the weighted outputs read by the un-permutation; the logits read by the router's
  kernel), each pass.
* **the host's wait**: a dropless all-to-all dispatcher learns how many tokens go to each
  expert only on the device, and the host needs the counts to size the all-to-all and the
  grouped matmul: Megatron-Core's ``MoEAlltoAllTokenDispatcher`` copies them to the host
  and waits for them (``_maybe_dtoh_and_synchronize``) once a layer's forward (the
  backward reuses them), as DeepEP's and HybridEP's dispatches do, and a recomputed
  forward waits again. The device runs dry while the host waits and launches what follows:
  :data:`HOST_SYNC_S` a wait, on a GPU (a program of a compiler with static shapes, as on a
  TPU, waits for nothing: 0).

Each constant's source is in :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardscope._src.cost.compute import by_kernel
from shardscope._src.targets.hardware import Hardware

#: Bytes of a router logit, probability or their gradients: float32 (Megatron-Core's
#: ``moe_router_dtype="fp32"``; DeepEP takes float32 probabilities only).
ROUTER_ITEMSIZE = 4
#: Bytes of an entry of the router's map of the experts each token picked (a bool).
MAP_ITEMSIZE = 1
#: Seconds a device runs dry at each wait of the host for a device-to-host copy (sources in
#: :data:`~shardscope._src.targets.hardware.TIME_MODEL_SOURCES`).
HOST_SYNC_S = 26e-6


@dataclass(frozen=True)
class Routing:
    """One layer with experts' routing on one device for one micro-batch, in rows.

    ``scored``: the tokens the router scores (the device's own); ``tokens``: the rows the
    permutation reads and the un-permutation writes (its own tokens, or those it received
    once each); ``slots``: the rows the permutation writes and the un-permutation reads (each
    token's ``top_k`` copies times the routing's capacity); ``sorted``: the rows the chunk
    sort reorders by local expert, each way (0: no sort); ``weighted``: the combine weights
    the experts' outputs by the router, and its backward reads them again.

    The bytes are those beyond the step's kept activations (see the module docstring):
    :attr:`stored` rows of the moves, and the router's logits, are priced there.
    """

    scored: float
    tokens: float
    slots: float
    experts: int
    d_model: int
    itemsize: int
    sorted: float = 0.0
    weighted: bool = True

    @property
    def row_moves(self) -> float:
        """Rows read or written by one pass's moves: the permutation (its tokens read, its
        slots written), the un-permutation (the reverse) and the sort and unsort (each
        sorted row read and written)."""
        return 2 * (self.tokens + self.slots) + 4 * self.sorted

    @property
    def stored(self) -> float:
        """Rows of the moves the step's kept activations already price, each pass: the
        experts' input as the sort (or else the permutation) writes it, and the weighted
        outputs the un-permutation reads."""
        return (self.sorted or self.slots) + (self.slots if self.weighted else 0.0)

    def forward_bytes(self) -> float:
        """HBM bytes of one forward beyond the kept activations': the moves, and the
        router's probabilities and map written.

        >>> r = Routing(scored=10, tokens=10, slots=20, experts=8, d_model=64, itemsize=2)
        >>> r.forward_bytes() == (2 * (10 + 20) - 2 * 20) * 64 * 2 + 10 * 8 * (4 + 1)
        True
        """
        router = self.scored * self.experts * (ROUTER_ITEMSIZE + MAP_ITEMSIZE)
        return (self.row_moves - self.stored) * self.d_model * self.itemsize + router

    def backward_bytes(self) -> float:
        """HBM bytes of one backward beyond the kept activations': the moves the other way
        for the gradients, the weighted outputs read again for the router weights'
        gradient, and the router's backward (the probabilities and their gradient read)."""
        rows = self.row_moves + (self.slots if self.weighted else 0.0) - self.stored
        router = self.scored * self.experts * 2 * ROUTER_ITEMSIZE
        return rows * self.d_model * self.itemsize + router


def host_sync_seconds(hw: Hardware, syncs: float) -> float:
    """What ``syncs`` waits of the host for the device cost: :data:`HOST_SYNC_S` each on a
    GPU (its eager training step launches kernel by kernel), 0 elsewhere.

    >>> from shardscope._src.targets.hardware import hardware
    >>> host_sync_seconds(hardware("h100"), 1000) == 1000 * HOST_SYNC_S
    True
    >>> host_sync_seconds(hardware("tpu-v5e"), 1000)
    0.0
    """
    return syncs * HOST_SYNC_S if by_kernel(hw) else 0.0
