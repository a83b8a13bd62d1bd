"""The sharding taster lab: each step of it is a function here, and each claim a named check.

``shardscope lab`` runs :func:`run`; the notebook ``notebooks/sharding_taster.py`` calls the
steps one by one. Every step takes the :class:`~shardscope.Lab` it records its checks in.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from shardscope._src.audit.compile import audit
from shardscope._src.base.devices import host_value
from shardscope._src.base.errors import LayoutError, is_int
from shardscope._src.lab.exercises import (
    EXERCISE_CONFIG,
    ONE_DEVICE,
    exercises_fit,
    run_exercise_checks,
)
from shardscope._src.lab.harness import Lab, bootstrap
from shardscope._src.layout import Layout, layout
from shardscope._src.mesh import make_mesh
from shardscope._src.render.audit import audit_table
from shardscope._src.render.plots import plot_device_bytes, prefetch_chart_library
from shardscope._src.sharding.demos import DEMO_FACTS, get_demo

LAB_ID = "sharding_taster"
ROWS = COLS = 1024  # the parameter matrix
BATCH = 16  # rows of the activation
MATMUL_RTOL = 1e-4  # float32 sums in another order: about 1e-7 observed


def lab_fits(devices: int) -> bool:
    """Whether every array of the lab splits evenly over ``devices``: the parameter's rows
    and columns (steps 2 to 6: the 1-D mesh is every device) and the exercises' block."""
    return ROWS % devices == 0 and COLS % devices == 0 and exercises_fit(devices)


def lab_device_counts() -> tuple[int, ...]:
    """Every device count the lab's arrays split evenly over (:func:`lab_fits`): among the
    divisors of the parameter's rows and columns."""
    both = math.gcd(ROWS, COLS)
    return tuple(d for d in range(1, both + 1) if both % d == 0 and lab_fits(d))


def check_devices(devices: int, *, given: bool = True, processes: int = 1) -> None:
    """Refuses a device count the lab's arrays do not split evenly over (its checks would
    fail for the count, not for what they check).

    ``given``: the count is the ``devices`` asked for (else the devices JAX has);
    ``processes``: the processes of a multi-process run, each with ``devices``.

    Raises:
        LayoutError: names the count and those that fit.
    """
    total = devices * processes
    if lab_fits(total):
        return
    counts = [str(n) for n in lab_device_counts()]
    params: tuple[str, ...] = ("devices",)
    if processes > 1:
        what = f"{processes} processes x {devices} = {total} devices"
        params = ("devices", "num_processes")
    else:
        what = f"devices={devices}" if given else f"JAX has {devices} devices"
    raise LayoutError(
        f"{what}: the lab splits a {ROWS} x {COLS} parameter and a tensor-parallel "
        f"decoder block of {EXERCISE_CONFIG.heads} heads evenly over every device, and "
        f"{total} devices do not divide them; give {', '.join(counts[:-1])} or {counts[-1]}"
        + (" in all" if processes > 1 else ""),
        param=params,
    )


def _local_shard_shapes(x: Any) -> set[tuple[int, ...]]:
    return {tuple(s.data.shape) for s in x.addressable_shards}


def make_inputs(lab: Lab) -> tuple[Any, Any]:
    """A (1024, 1024) parameter and a (16, 1024) activation, float32, from the lab's seed."""

    rng = np.random.default_rng(lab.seed)
    w = rng.standard_normal((ROWS, COLS), dtype=np.float32) / np.sqrt(ROWS)
    x = rng.standard_normal((BATCH, ROWS), dtype=np.float32)
    return x, w


def mesh_1d(lab: Lab) -> Any:
    """Step 1: a 1-D mesh named ``model`` over every device."""

    n = jax.device_count()
    mesh = make_mesh({"model": n}, axis_types="auto")
    lab.check(
        "mesh_1d",
        lambda: dict(mesh.shape) == {"model": n} and mesh.devices.size == n,
        f"mesh ('model',) of {n} devices",
    )
    return mesh


def shard_parameter(lab: Lab, mesh: Any, w_host: Any) -> Any:
    """Step 2: the parameter placed row-wise, ``P("model", None)``: each device gets a band."""

    n = mesh.shape["model"]
    want = (ROWS // n, COLS)
    placed: dict[str, Any] = {}

    def place() -> bool:
        placed["w"] = jax.device_put(w_host, NamedSharding(mesh, P("model", None)))
        return _local_shard_shapes(placed["w"]) == {want}

    lab.check(
        "param_row_shards",
        place,
        f"every shard of w is {want[0]} x {want[1]} ({ROWS}/{n} rows, all columns)"
        if ROWS % n == 0
        else f"{ROWS} rows do not split evenly over {n} devices",
        details={"shard_shape": list(want), "devices": n},
    )
    return placed.get("w")


def sharded_matmul(lab: Lab, mesh: Any, x_host: Any, w: Any | None) -> Any:
    """Step 3: replicated activation times the row-sharded parameter, against one device."""

    if w is None:
        lab.skip("matmul_matches_single_device", "no sharded parameter (param_row_shards failed)")
        audit_demo(lab, "matmul_one_all_reduce", "matmul", mesh)
        return None
    x = jax.device_put(x_host, NamedSharding(mesh, P()))
    y = jax.jit(jnp.matmul)(x, w)
    one = jax.local_devices()[0]
    w_host = host_value(w)
    y_ref = jnp.matmul(jax.device_put(x_host, one), jax.device_put(w_host, one))
    lab.assert_close("matmul_matches_single_device", host_value(y), y_ref, rtol=MATMUL_RTOL)
    audit_demo(lab, "matmul_one_all_reduce", "matmul", mesh)
    return y


def audit_demo(lab: Lab, check: str, demo: str, mesh: Any) -> Any:
    """Audits one of the taster's programs compiled on ``mesh`` and checks XLA's collectives.

    ``matmul``: exactly one all-reduce over ``model`` of 16 x 1024 x 4 bytes. ``reshard``
    (rows to columns inside ``jit``): exactly one all-to-all of the whole array. Prints the
    audit table either way.
    """

    if mesh.devices.size < 2:
        lab.skip(check, ONE_DEVICE)
        return None

    kind, payload = DEMO_FACTS[demo]
    done: dict[str, Any] = {}

    def audited() -> bool:
        done["program"] = program = get_demo(demo, mesh)
        done["audit"] = audit(program)
        program.check(done["audit"])
        return True

    lab.check(
        check,
        audited,
        f"one {kind} over 'model' of {payload:,} bytes",
        details={"kind": kind, "axis": "model", "payload_bytes": payload},
    )
    if "audit" in done:
        program = done["program"]
        lab.print(audit_table(done["audit"], title=f"{program.name}: {program.description}"))
    return done.get("audit")


def reshard(lab: Lab, mesh: Any, w: Any | None) -> None:
    """Step 4: ``jax.device_put`` moves the same values to column shards, then to replicated."""

    if w is None:
        for name in ("reshard_to_columns", "reshard_to_replicated"):
            lab.skip(name, "no sharded parameter (param_row_shards failed)")
        audit_demo(lab, "reshard_in_jit_one_all_to_all", "reshard", mesh)
        return
    n = mesh.shape["model"]
    before = host_value(w)

    def moved(spec: P, shard: tuple[int, int]) -> bool:
        after = jax.device_put(w, NamedSharding(mesh, spec))
        return _local_shard_shapes(after) == {shard} and np.array_equal(host_value(after), before)

    lab.check(
        "reshard_to_columns",
        lambda: moved(P(None, "model"), (ROWS, COLS // n)),
        f"values unchanged, shards {ROWS} x {COLS // n}",
    )
    lab.check(
        "reshard_to_replicated",
        lambda: moved(P(), (ROWS, COLS)),
        f"values unchanged, every device holds all {ROWS} x {COLS}",
    )
    audit_demo(lab, "reshard_in_jit_one_all_to_all", "reshard", mesh)


def mesh_2d(lab: Lab) -> Any | None:
    """Step 5: a 2-D mesh ``("dp", "mp")`` (2 x 4 on 8 devices); an (8, 1024) array on it."""

    n = jax.device_count()
    if n % 2 or n < 4:
        lab.skip(
            "mesh_2d_shards", f"a 2-D (2, n/2) mesh needs an even device count >= 4, found {n}"
        )
        return None
    mesh = make_mesh({"dp": 2, "mp": n // 2}, axis_types="auto")
    a_host = np.arange(8 * COLS, dtype=np.float32).reshape(8, COLS)
    want = (8 // 2, COLS // (n // 2))
    placed: dict[str, Any] = {}

    def place() -> bool:
        # Inside the check: a mesh axis that does not divide the array is a failure, not a crash.
        a = placed["a"] = jax.device_put(a_host, NamedSharding(mesh, P("dp", "mp")))
        return (
            dict(mesh.shape) == {"dp": 2, "mp": n // 2}
            and _local_shard_shapes(a) == {want}
            and np.array_equal(host_value(a), a_host)
        )

    lab.check(
        "mesh_2d_shards",
        place,
        f"(8, {COLS}) with P('dp', 'mp') on dp=2 x mp={n // 2}: shards {want[0]} x {want[1]}",
    )
    if "a" in placed:
        lab.print(layout(placed["a"]).__rich__())
    return mesh


def memory_layouts(mesh: Any, mesh2: Any | None) -> dict[str, Layout]:
    """The same (1024, 1024) float32 tensor under replicated, 1-D and 2-D layouts."""

    shape = (ROWS, COLS)
    out = {
        "replicated": layout(shape, NamedSharding(mesh, P()), dtype="float32"),
        "1-D P('model', None)": layout(shape, NamedSharding(mesh, P("model", None))),
    }
    if mesh2 is not None:
        out["2-D P('dp', 'mp')"] = layout(shape, NamedSharding(mesh2, P("dp", "mp")))
    return out


def memory_picture(lab: Lab, mesh: Any, mesh2: Any | None) -> Path | None:
    """Step 6: bytes per device of one tensor under each layout, as a PNG bar chart."""

    n = mesh.shape["model"]
    full = ROWS * COLS * 4
    expected = {"replicated": full, "1-D P('model', None)": full // n}
    if mesh2 is not None:
        expected["2-D P('dp', 'mp')"] = full // n
    made: dict[str, dict[str, Layout]] = {}

    def held() -> bool:
        made["layouts"] = memory_layouts(mesh, mesh2)
        got = {k: set(v.device_bytes.values()) for k, v in made["layouts"].items()}
        return got == {k: {v} for k, v in expected.items()}

    lab.check(
        "per_device_bytes",
        held,
        ", ".join(f"{k}: {v:,} B" for k, v in expected.items()),
        details={"bytes_per_device": expected},
    )
    layouts = made.get("layouts")
    if layouts is None:
        lab.skip("memory_plot_png", "no layouts to draw (per_device_bytes failed)")
        return None
    for lay in layouts.values():
        lab.print(lay.__rich__())
    path = lab.out_dir / f"{lab.lab_id}_memory.png"
    if not lab.primary:
        return path

    def draw() -> bool:
        return plot_device_bytes(layouts, path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    return path if lab.check("memory_plot_png", draw, str(path)) else None


def processes_agree(lab: Lab) -> None:
    """In a multi-process run: one check that every process passed its own checks.

    Only process 0 reports, so without this a check failing on another process's shards would
    be missing from the scorecard. Every process must call it (it is a collective).
    """

    n = jax.process_count()
    if n < 2:
        return

    failed = sum(1 for r in lab.results if not r.skipped and not r.passed)
    counts = np.asarray(multihost_utils.process_allgather(np.array([failed]))).reshape(n)
    bad = {i: int(c) for i, c in enumerate(counts) if c}
    lab.check(
        "all_processes_passed",
        not bad,
        f"all {n} processes passed their own checks"
        if not bad
        else "failed checks by process: " + ", ".join(f"{i}: {c}" for i, c in bad.items()),
        details={"failed_by_process": [int(c) for c in counts]},
    )


def exercises(lab: Lab, mesh: Any) -> dict[str, Any]:
    """Step 7, the taster's exercises: a Megatron tensor-parallel decoder block on the 1-D
    mesh against one device, its exact collectives against the minimum, its shard_map twin
    with explicit ``psum``, and the sequence-parallel variant's verdict."""

    return run_exercise_checks(lab, mesh_spec=f"model={mesh.shape['model']}")


def run(
    devices: int | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    verbose: bool = True,
    seed: int = 0,
) -> tuple[Lab, dict[str, Any]]:
    """Runs the whole taster; returns the lab and its summary, having written the JSON.

    Raises:
        LayoutError: ``devices`` (or, when None, the devices JAX has) that the lab's arrays do
            not split evenly over (:func:`check_devices`), before any check runs.
    """
    if is_int(devices, 1):
        check_devices(devices)  # before JAX starts
    prefetch_chart_library()  # step 6 draws; the import runs while XLA compiles steps 1-5
    lab = bootstrap(LAB_ID, seed=seed, out_dir=out_dir, devices=devices, verbose=verbose)
    # those of XLA_FLAGS, an accelerator's, every process's together
    check_devices(jax.device_count(), given=False)
    x_host, w_host = make_inputs(lab)
    mesh = mesh_1d(lab)
    w = shard_parameter(lab, mesh, w_host)
    sharded_matmul(lab, mesh, x_host, w)
    reshard(lab, mesh, w)
    mesh2 = mesh_2d(lab)
    png = memory_picture(lab, mesh, mesh2)
    exercises(lab, mesh)
    processes_agree(lab)
    summary = lab.summary()
    path = lab.save()
    lab.print(f"wrote {path}" + (f" and {png}" if png else ""))
    return lab, summary
