"""Built-in demo programs for ``shardscope audit`` and the lab: the taster's two steps.

Each demo is a jitted function with ``jax.ShapeDtypeStruct`` arguments (nothing allocated)
on a mesh; :func:`shardscope.audit` accepts a :class:`Demo` directly (it has ``lower()``).

>>> import shardscope
>>> demo = taster_matmul("model=8")
>>> shardscope.audit(demo).counts()["all-reduce"]
1
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardscope._src.base.comm import CollectiveKind
from shardscope._src.base.errors import MeshSpecError, ShardscopeError
from shardscope._src.mesh import first_devices_mesh, parse_mesh_spec

DEFAULT_MESH = "model=8"
DEMO_FACTS: dict[str, tuple[CollectiveKind, int]] = {  # what XLA inserts on a 1-D mesh
    "matmul": (CollectiveKind.ALL_REDUCE, 16 * 1024 * 4),
    "reshard": (CollectiveKind.ALL_TO_ALL, 1024 * 1024 * 4),
}


@dataclass(frozen=True)
class Demo:
    """A program to audit: ``fn`` jitted, ``args`` its example arguments, on ``mesh``."""

    name: str
    description: str
    fn: Any
    args: tuple[Any, ...]
    mesh: Any
    axis: str
    expected_kind: str
    expected_payload_bytes: int

    def lower(self) -> Any:
        """``jax.stages.Lowered`` of the program."""
        return self.fn.lower(*self.args)

    def check(self, audit: Any) -> None:
        """Raises ``AssertionError`` unless ``audit`` (of this demo) is the taster's fact.

        The fact: exactly one collective, of ``expected_kind``, over the demo's axis alone,
        moving ``expected_payload_bytes``; the message says what differed. It holds on 1-D
        meshes; beside another axis XLA may choose other collectives (JAX 0.10.2 on CPU all-gathers
        the matmul's weight on ``data=2,model=4``), and the audit then says so.
        """
        counts = {k.replace("-", "_"): 0 for k in audit.counts()}
        counts[self.expected_kind.replace("-", "_")] = 1
        audit.expect(**counts)
        (c,) = audit.collectives
        if (c.axes, c.payload_bytes) != ((self.axis,), self.expected_payload_bytes):
            raise AssertionError(
                f"{self.name}: expected one {self.expected_kind} over ({self.axis!r},) of "
                f"{self.expected_payload_bytes} bytes, found one over {c.axes} of "
                f"{c.payload_bytes} bytes at {c.source}"
            )


def demo_mesh(mesh: Any = None) -> Any:
    """A ``Mesh`` from a Mesh, a description such as ``"dp=2,model=4"``, or None (model=8).

    A description smaller than the devices JAX has uses the first devices.
    """
    if mesh is not None and not isinstance(mesh, str):
        return mesh

    return first_devices_mesh(mesh or DEFAULT_MESH, axis_types="auto")


def _axis(mesh: Any) -> str:
    # The taster shards over "model"; on other meshes the last (innermost) axis plays it.
    names = [str(n) for n in mesh.axis_names]
    return "model" if "model" in names else names[-1]


def _check_divides(axis: str, size: int, dim: int, what: str) -> None:
    if dim % size:
        raise MeshSpecError(
            f"the demo shards {what} of size {dim} over axis {axis!r} of size {size}, which "
            f"does not divide it; use an axis size that divides {dim}"
        )


def taster_matmul(mesh: Any = None) -> Demo:
    """Replicated ``x (16, 1024) f32`` times ``w (1024, 1024) f32`` sharded ``P(axis, None)``.

    The contraction is split over the axis, so XLA adds one all-reduce of the
    ``16 x 1024 x 4``-byte result over it.
    """

    m = demo_mesh(mesh)
    axis = _axis(m)
    _check_divides(axis, int(m.shape[axis]), 1024, "w's rows")
    x = jax.ShapeDtypeStruct((16, 1024), jnp.float32, sharding=NamedSharding(m, P()))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=NamedSharding(m, P(axis, None)))

    def matmul(x: Any, w: Any) -> Any:
        return x @ w

    return Demo(
        name="matmul",
        description=f"x[16,1024] replicated @ w[1024,1024] sharded P({axis!r}, None)",
        fn=jax.jit(matmul),
        args=(x, w),
        mesh=m,
        axis=axis,
        expected_kind=DEMO_FACTS["matmul"][0],
        expected_payload_bytes=DEMO_FACTS["matmul"][1],
    )


def taster_reshard(mesh: Any = None) -> Demo:
    """``w (1024, 1024) f32`` resharded inside ``jit`` from rows ``P(axis, None)`` to columns.

    XLA moves the blocks with one all-to-all over the axis.
    """

    m = demo_mesh(mesh)
    axis = _axis(m)
    _check_divides(axis, int(m.shape[axis]), 1024, "w's rows and columns")
    rows = NamedSharding(m, P(axis, None))
    cols = NamedSharding(m, P(None, axis))
    w = jax.ShapeDtypeStruct((1024, 1024), jnp.float32, sharding=rows)

    def reshard(w: Any) -> Any:
        return jax.lax.with_sharding_constraint(w, cols)

    return Demo(
        name="reshard",
        description=f"w[1024,1024] resharded P({axis!r}, None) -> P(None, {axis!r})",
        fn=jax.jit(reshard, out_shardings=cols),
        args=(w,),
        mesh=m,
        axis=axis,
        expected_kind=DEMO_FACTS["reshard"][0],
        expected_payload_bytes=DEMO_FACTS["reshard"][1],
    )


DEMOS: dict[str, Callable[[Any], Demo]] = {
    "matmul": taster_matmul,
    "reshard": taster_reshard,
}


def check_demo(name: str, mesh_spec: str | None = None) -> None:
    """Refuses, with no device, a demo name or mesh description the demo cannot run on."""
    if name not in DEMOS:
        raise ShardscopeError(f"unknown demo {name!r}; the built-in demos are {', '.join(DEMOS)}")
    axes = parse_mesh_spec(mesh_spec or DEFAULT_MESH)
    axis = "model" if "model" in axes else list(axes)[-1]
    what = "w's rows and columns" if name == "reshard" else "w's rows"
    _check_divides(axis, axes[axis], 1024, what)


def get_demo(name: str, mesh: Any = None) -> Demo:
    """The demo called ``name`` (see :data:`DEMOS`) on ``mesh``."""
    if name not in DEMOS:
        raise ShardscopeError(f"unknown demo {name!r}; the built-in demos are {', '.join(DEMOS)}")
    return DEMOS[name](mesh)
