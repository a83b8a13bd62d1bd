"""What a compiled program holds in device memory, and whether it fits.

:class:`CompiledMemory` is the compiler's buffer assignment per device, as
``compiled.memory_analysis()`` reports it; its JSON keeps XLA's field names. How many bytes
a program holds (:attr:`~CompiledMemory.buffer_bytes`, :attr:`~CompiledMemory.held_bytes`,
:meth:`~CompiledMemory.held_by`) and whether a device holds them (:func:`memory_fits`) are
written here once, for the audit and every planner.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

from shardscope._src.base.errors import RecordError
from shardscope._src.targets.specs import Target

#: The suffix of the byte counts ``memory_analysis()`` reports (JAX 0.10.2's
#: ``CompiledMemoryStats``, the same type on the CPU, GPU and TPU compilers).
_BYTES = "_in_bytes"


@dataclass(frozen=True)
class CompiledMemory(Mapping[str, int]):
    """A compiler's buffer assignment per device, in bytes: the fields of
    ``compiled.memory_analysis()`` (JAX 0.10.2, every compiler alike).

    A field is None where the record it was read from does not report it. Fields a later
    JAX adds are kept in :attr:`extra`, so the record writes back what it read. The record
    also reads as a mapping by XLA's field names, as earlier versions' memory dict did
    (``memory["temp_size_in_bytes"]``).

    >>> m = CompiledMemory.from_dict({"argument_size_in_bytes": 64, "output_size_in_bytes": 64,
    ...                               "temp_size_in_bytes": 32, "alias_size_in_bytes": 64,
    ...                               "peak_memory_in_bytes": 80})
    >>> m.buffer_bytes, m.held_bytes, m["temp_size_in_bytes"]
    (96, 80, 32)
    """

    alias_size_in_bytes: int | None = None
    argument_size_in_bytes: int | None = None
    generated_code_size_in_bytes: int | None = None
    host_alias_size_in_bytes: int | None = None
    host_argument_size_in_bytes: int | None = None
    host_generated_code_size_in_bytes: int | None = None
    host_output_size_in_bytes: int | None = None
    host_temp_size_in_bytes: int | None = None
    output_size_in_bytes: int | None = None
    peak_memory_in_bytes: int | None = None
    temp_size_in_bytes: int | None = None
    #: byte counts this record has no field for (a later JAX's), by name, in name order
    extra: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra", tuple(sorted(self.extra)))

    @classmethod
    def from_stats(cls, stats: Any) -> CompiledMemory | None:
        """The record of what ``compiled.memory_analysis()`` returned (None: it reported
        nothing): every public whole-number attribute whose name ends in ``_in_bytes``."""
        if stats is None:
            return None
        found = {}
        for name in dir(stats):
            if name.endswith(_BYTES) and not name.startswith("_"):
                value = getattr(stats, name)
                if isinstance(value, int):
                    found[name] = value
        return cls.from_dict(found)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CompiledMemory:
        """The record :meth:`to_dict` wrote (XLA's field names to bytes), or any version's
        memory dict; a :class:`CompiledMemory` is returned as it is.

        Raises:
            RecordError: ``data`` is not a mapping, or holds a value that is not a number.
        """
        if isinstance(data, CompiledMemory):
            return data
        if not isinstance(data, Mapping):
            raise RecordError(
                f"a compiled memory record must be a JSON object of byte counts, got "
                f"{type(data).__name__}; write it again with this shardscope"
            )
        named: dict[str, int] = {}
        extra: list[tuple[str, int]] = []
        for key, value in data.items():
            try:
                count = int(value)
            except (TypeError, ValueError):
                raise RecordError(
                    f"compiled memory field {str(key)!r} must be a number of bytes, got "
                    f"{value!r}; write it again with this shardscope"
                ) from None
            if key in _NAMES:
                named[key] = count
            else:
                extra.append((str(key), count))
        return cls(**named, extra=tuple(extra))

    def to_dict(self) -> dict[str, int]:
        """XLA's field names to bytes, in name order (the order ``dir()`` lists them), the
        fields the record does not report left out."""
        return dict(self.items())

    # -- the mapping by XLA's field names ----------------------------------------------------

    def __getitem__(self, key: str) -> int:
        if key in _NAMES:
            value = getattr(self, key)
            if value is not None:
                return int(value)
        else:
            for name, count in self.extra:
                if name == key:
                    return count
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        named = (name for name in _NAMES if getattr(self, name) is not None)
        return iter(sorted([*named, *(name for name, _ in self.extra)]))

    def __len__(self) -> int:
        return sum(1 for _ in self)

    # -- what the program holds --------------------------------------------------------------

    @property
    def buffer_bytes(self) -> int:
        """Bytes per device in the buffer assignment: arguments + outputs + temporaries -
        what outputs alias from arguments (a field not reported counts 0)."""
        return (
            (self.argument_size_in_bytes or 0)
            + (self.output_size_in_bytes or 0)
            + (self.temp_size_in_bytes or 0)
            - (self.alias_size_in_bytes or 0)
        )

    @property
    def held_bytes(self) -> int:
        """Bytes a GPU or TPU compiler's program holds in device memory at once: its buffer
        assignment (:attr:`buffer_bytes`), or its own peak (``peak_memory_in_bytes``) where
        that is less.

        XLA:GPU's peak and its buffers agree (within 0.3% on the calibration runs). XLA:TPU's
        ``temp_size_in_bytes`` counts temporaries that do not share the memory at once:
        Mixtral 8x7B's step on a v6e-256 at 12 sequences a chip compiled with 43.3 GiB of
        them, though the TPU compiler refuses, when it compiles, a program over the chip's
        31.25 GiB (it did at 16 a chip); its peak said 29.8 GiB. With activations offloaded to
        host memory, that peak counts the host's too (Llama 3.1 70B on a v6e-64: 49.1 GiB, 45
        of them on the host), and the buffers are the lesser figure."""
        peak = self.peak_memory_in_bytes or 0
        buffers = self.buffer_bytes
        return min(buffers, peak) if peak > 0 else buffers

    def held_by(self, compiler: Target) -> int:
        """Bytes per device the program holds, built by ``compiler``: a GPU's or a TPU's
        (:attr:`held_bytes`), or the CPU compiler's buffer assignment (:attr:`buffer_bytes`:
        XLA:CPU's ``peak_memory_in_bytes`` is its arguments and outputs alone, no
        temporaries)."""
        return self.held_bytes if compiler.is_accelerator else self.buffer_bytes


#: The byte counts :class:`CompiledMemory` has a field for.
_NAMES = frozenset(f.name for f in fields(CompiledMemory) if f.name.endswith(_BYTES))


def memory_fits(
    held_bytes: float,
    limit_bytes: float,
    *,
    host_bytes: float = 0,
    host_limit_bytes: float = 0,
) -> bool:
    """Whether a device holds ``held_bytes`` within its memory, ``limit_bytes``, and its
    host the ``host_bytes`` kept there (offloaded activations, an offloaded optimizer state)
    within ``host_limit_bytes``: the one fit rule of every plan.

    >>> memory_fits(80, 80), memory_fits(81, 80), memory_fits(8, 80, host_bytes=1)
    (True, False, False)
    """
    return held_bytes <= limit_bytes and host_bytes <= host_limit_bytes


def least_devices_for_state(
    params: int,
    itemsize: int,
    memory_bytes: float,
    *,
    bytes_per_param: int | None = None,
    host_memory_bytes: float = 0,
) -> int:
    """The fewest devices that hold a model's state sharded over all of them, a count below
    which no layout fits whatever its activations: the parameters (``itemsize`` bytes each:
    a server's weights, where ``bytes_per_param`` is None) or, in training,
    ``bytes_per_param`` bytes each of parameters, gradients and optimizer state, or (with
    ``host_memory_bytes`` per device on the host) the optimizer state there where that
    takes fewer devices.

    DeepSeek-V3's 671B parameters in mixed-precision Adam on 80 GB devices, alone and
    with 250 GB of host memory each for the optimizer state, and its 16-bit weights alone:

    >>> p = 671_000_000_000
    >>> least_devices_for_state(p, 2, 80e9, bytes_per_param=16)
    135
    >>> least_devices_for_state(p, 2, 80e9, bytes_per_param=16, host_memory_bytes=250e9)
    34
    >>> least_devices_for_state(p, 2, 80e9)
    17
    """

    def least(state: float, limit: float) -> int:
        return max(1, math.ceil(state / limit))

    if bytes_per_param is None:
        return least(params * itemsize, memory_bytes)
    on_device = least(params * bytes_per_param, memory_bytes)
    if host_memory_bytes <= 0:
        return on_device
    weights_and_grads = params * 2 * itemsize
    optimizer = params * max(0, bytes_per_param - 2 * itemsize)
    on_host = max(least(weights_and_grads, memory_bytes), least(optimizer, host_memory_bytes))
    return min(on_device, on_host)
