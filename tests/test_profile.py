"""Measured beside predicted: real programs profiled on 8 simulated CPU devices and their
traces joined to their audits exactly; traces that do not join refused; a GPU-shaped trace
joined by its device planes."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import shardscope
from helpers import PROGRAMS, assert_drawn, assert_usage_error, read_png
from shardscope._src.audit.user_program import load_program
from shardscope._src.base.records import write_result
from shardscope._src.model.config import ModelConfig
from shardscope._src.profile.records import Profile
from shardscope._src.profile.run import profile, profile_trace
from shardscope._src.profile.trace import read_trace
from shardscope._src.render.profile import format_profile
from shardscope._src.sharding.programs import build_reference_program

TINY = ModelConfig(d_model=32, heads=8, ff=64, layers=2, batch=8, seq=8)
STEPS, DEVICES = 2, 8
TRIPS = 3  # the scanned step's loop


def _scanned_step(mesh):
    """A step whose one collective (the sum over `data`) runs in a loop of TRIPS trips."""

    @jax.jit
    def scanned(x):
        def body(carry, _):
            return carry + jnp.sum(carry * carry, axis=0, keepdims=True), None

        return jax.lax.scan(body, x, None, length=TRIPS)[0]

    x = jax.ShapeDtypeStruct((16, 8), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    return scanned, (x,)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """``{name: (Profile, audit)}``: each program profiled for STEPS steps, and its audit."""
    out = {}
    for strategy, mesh in (("dp", "data=8"), ("fsdp", "data=8"), ("tp", "model=8")):
        prog = build_reference_program(strategy, TINY, mesh, mode="train")
        p = profile(prog.fn, *prog.abstract_args(), steps=STEPS)
        out[strategy] = (p, p.audit)  # the audit of the program that ran
    mesh = shardscope.make_mesh("data=8")
    step, args = _scanned_step(mesh)
    p = profile(step, *args, steps=STEPS)
    out["scan"] = (p, p.audit)
    return out


@pytest.fixture(scope="module")
def explicit_cli(tmp_path_factory):
    """The explicit-axis Llama (layers scanned) profiled by ``shardscope profile``: its JSON,
    its PNG, its kept trace, and the audit of the same program."""
    from shardscope._src.cli.main import main

    out = tmp_path_factory.mktemp("explicit")
    ref = f"{PROGRAMS / 'explicit_llama.py'}:make_step"
    argv = ["profile", ref, "--mesh", "data=2,model=4", "--steps", str(STEPS)]
    argv += ["--json", str(out / "p.json"), "--png", str(out / "p.png")]
    argv += ["--trace-dir", str(out / "trace")]
    assert main(argv) == 0
    found = shardscope.audit_program(load_program(ref), "data=2,model=4")
    data = json.loads((out / "p.json").read_text())
    return Profile.from_dict(data), found, out


def _check_join(p: Profile, audit) -> None:
    assert (p.steps, p.devices) == (STEPS, DEVICES)
    names = {c.name: c for c in audit.collectives}
    assert {c.name for c in p.collectives} == set(names)
    for c in p.collectives:
        # one event per execution of the instruction on each device in each step
        assert c.events == names[c.name].count * STEPS * DEVICES, c.name
    assert p.coverage == (len(names), len(names), len(names))


@pytest.mark.parametrize("name", ["dp", "fsdp", "tp", "scan"])
def test_every_collective_of_the_audit_is_joined_as_often_as_it_runs(profiled, name):
    p, audit = profiled[name]
    assert audit.collectives, "the program has collectives to join"
    _check_join(p, audit)


def test_the_scanned_step_runs_its_collective_once_a_trip(profiled):
    p, _ = profiled["scan"]
    (c,) = p.collectives
    assert (c.kind, c.axes, c.count) == ("all-reduce", "data", TRIPS)
    assert c.events == TRIPS * STEPS * DEVICES
    # synchronous, and the loop's event encloses it without being compute: mostly exposed
    assert c.exposed_s > 0.5 * c.time_s


def test_the_explicit_program_joins_through_the_command_line(explicit_cli):
    p, audit, out = explicit_cli
    _check_join(p, audit)
    assert any(c.count > 1 for c in p.collectives)  # its scanned layers' collectives
    image = read_png(out / "p.png")
    assert_drawn(image, image.shape[1], image.shape[0])
    assert read_trace(out / "trace").files  # the trace was kept where asked


def test_a_trace_joined_to_its_program_compiled_for_the_cpu_gets_its_devices(
    explicit_cli, monkeypatch, capsys
):
    from shardscope._src.cli import profile as cli_profile
    from shardscope._src.cli.main import main

    simulated = []  # what a fresh process would simulate before JAX starts
    monkeypatch.setattr(cli_profile, "simulate_devices", simulated.append)
    _, _, out = explicit_cli
    ref = f"{PROGRAMS / 'explicit_llama.py'}:make_step"
    argv = ["profile", "--trace", str(out / "trace"), ref, "--mesh", "data=2,model=4"]
    assert main([*argv, "--target", "cpu"]) == 0
    assert simulated == [2 * 4]
    assert "names alone" in capsys.readouterr().out


def test_step_figures_add_up_and_the_timeline_marks_only_uncovered_time(profiled):
    for p, _ in profiled.values():
        for s in p.per_step:
            assert 0 <= s.exposed_s <= s.comm_s + 1e-12 and s.compute_s > 0
            # each device: its busy time (compute, and communication beside none) fits in
            # the step; idle time is the rest
            assert s.compute_s + s.exposed_s + s.idle_s == pytest.approx(s.step_s, rel=1e-9)
        for row in p.timeline:
            for a, b in row.exposed:
                assert b > a
                assert any(s.start_s - 1e-12 <= a and b <= s.end_s + 1e-12 for s in row.collectives)
                assert all(b <= x or a >= y for x, y in row.compute)
        exposed = sum(b - a for r in p.timeline for a, b in r.exposed) / p.devices
        assert exposed == pytest.approx(p.per_step[p.timeline_step].exposed_s, rel=1e-9)


def test_json_reads_back_and_the_table_names_every_collective(profiled, tmp_path):
    p, _ = profiled["fsdp"]
    path = write_result(tmp_path / "p.json", p)
    again = Profile.from_dict(json.loads(Path(path).read_text()))
    assert again == p and again.audit is None
    text = format_profile(p, width=200)
    for c in p.collectives:
        assert c.name in text
    assert f"{DEVICES} devices" in text


def test_hardware_prices_the_predictions_beside_the_measured(two_programs):
    folder, audit_a, _ = two_programs
    plain = profile_trace(folder, audit_a)
    assert plain.predicted is None and plain.collectives[0].predicted_s is None
    priced = profile_trace(folder, audit_a, hardware="h100")
    assert priced.priced_on == "h100" and priced.predicted is not None
    (c,) = priced.collectives
    assert c.predicted_s is not None and 0 < c.predicted_exposed_s <= c.predicted_s
    assert priced.predicted.comm_s == pytest.approx(c.predicted_s * c.count)
    assert (c.events, c.time_s) == (plain.collectives[0].events, plain.collectives[0].time_s)


def test_an_audit_read_from_json_names_the_way_to_price_it(two_programs, tmp_path):
    folder, audit_a, _ = two_programs
    path = write_result(tmp_path / "a.json", audit_a)
    plain = profile_trace(folder, path)
    assert plain.priced_on is None
    text = " ".join(format_profile(plain, width=400).split())  # the caption wraps
    assert "join the trace to the program" in text
    with pytest.raises(shardscope.ProfileError, match="profile_program_trace") as e:
        profile_trace(folder, path, hardware="h100")
    assert e.value.params == ("hardware",)
    assert "FILE.py:FUNCTION --mesh SPEC --hardware h100" in e.value.shell


# -- traces that do not join: one error, nothing written ------------------------------------


def _psum_step(name, devices=8):
    """A jitted step called ``name`` whose one collective sums over ``devices`` devices."""
    mesh = shardscope.make_mesh(f"data={devices}", devices=jax.devices()[:devices])

    def step(x):
        return jnp.sum(x, axis=0)

    step.__name__ = name
    x = jax.device_put(np.ones((16, 4), np.float32), NamedSharding(mesh, P("data")))
    return jax.jit(step), x


def _gather_step(name):
    mesh = shardscope.make_mesh("data=8")

    def step(x):
        return jax.sharding.reshard(x * 2, NamedSharding(mesh, P()))

    step.__name__ = name
    x = jax.device_put(np.ones((16, 4), np.float32), NamedSharding(mesh, P("data")))
    return jax.jit(step), x


@pytest.fixture(scope="module")
def two_programs(tmp_path_factory):
    """A trace of two programs run in turn (``jit_a``: a sum, ``jit_b``: a sum and a
    gather), and the audit of each."""
    a, x = _psum_step("a")
    b, y = _gather_step("b")
    jax.block_until_ready((a(x), b(y)))
    folder = tmp_path_factory.mktemp("two")
    with jax.profiler.trace(str(folder)):
        for _ in range(STEPS):
            jax.block_until_ready((a(x), b(y)))
    return folder, shardscope.audit(a, x), shardscope.audit(b, y)


def test_events_of_another_program_are_left_out(two_programs):
    folder, audit_a, audit_b = two_programs
    for audit in (audit_a, audit_b):
        p = profile_trace(folder, audit)
        _check_join(p, audit)
        assert p.other_events > 0


def test_a_trace_of_another_program_is_refused(two_programs):
    folder, audit_a, _ = two_programs
    c, x = _psum_step("c")
    other = shardscope.audit(c, x)
    with pytest.raises(shardscope.ProfileError, match="no event of program 'jit_c'.*'jit_a'"):
        profile_trace(folder, other)
    # a program of the same name, compiled otherwise: its instructions are not the trace's
    same_name = shardscope.audit(*_gather_step("a"))
    assert same_name.module_name == audit_a.module_name
    with pytest.raises(shardscope.ProfileError, match="does not have"):
        profile_trace(folder, same_name)


def test_a_trace_of_the_program_on_another_mesh_is_refused(two_programs):
    folder, audit_a, _ = two_programs
    # the same step on 4 devices: its program's name is the traced one's, and its mesh is not
    on_four = shardscope.audit(*_psum_step("a", devices=4))
    assert on_four.module_name == audit_a.module_name
    with pytest.raises(shardscope.ProfileError, match="ran on 8 devices.*data=4 has 4"):
        profile_trace(folder, on_four)


def test_a_joined_trace_says_it_matched_by_names_and_which_session_it_read(
    two_programs, profiled, tmp_path
):
    folder, audit_a, _ = two_programs
    run_here, _ = profiled["dp"]
    assert run_here.joined_by == "run"
    assert "names alone" not in format_profile(run_here, width=400)
    joined = profile_trace(folder, audit_a)
    assert (joined.joined_by, joined.sessions) == ("names", 1)
    assert "names alone" in format_profile(joined, width=400)
    # the folder traced again earlier: two sessions, the newest read and named
    (session,) = {Path(f).parent for f in read_trace(folder).files}
    twice = tmp_path / "twice"
    shutil.copytree(folder, twice)
    shutil.copytree(session, twice / session.relative_to(folder).parent / "2000_01_01_00_00_00")
    again = profile_trace(twice, audit_a)
    assert (again.session, again.sessions) == (session.name, 2)
    assert again.collectives == joined.collectives
    assert f"read session {session.name}, the newest of the 2" in format_profile(again, width=400)
    with pytest.raises(shardscope.ProfileError, match="newest of the 2"):
        profile_trace(twice, shardscope.audit(*_psum_step("c")))


def test_a_collective_of_several_scopes_is_one_row_naming_them(profiled):
    p, audit = profiled["dp"]
    parts = {c.name: {x.scope for x in c.parts} for c in audit.collectives}
    combined = [c for c in p.collectives if len(parts[c.name]) > 1]
    assert combined, "the data-parallel step reduces several layers' gradients at once"
    rows = p.by_scope()
    for c in combined:
        (row,) = [r for r in rows if r.scopes and set(r.scopes) == parts[c.name]]
        assert (row.axes, row.kind, row.count) == (c.axes, c.kind, c.count)
        assert row.time_s == pytest.approx(c.step_time_s)
        assert " + ".join(row.scopes) in format_profile(p, width=400, by_scope=True)
    # every collective's time is in exactly one row
    total = sum(c.step_time_s for c in p.collectives)
    assert sum(r.time_s for r in rows) == pytest.approx(total)


def test_a_folder_without_a_trace_or_device_events_is_refused(two_programs, tmp_path):
    _, audit_a, _ = two_programs
    with pytest.raises(shardscope.ProfileError, match="holds no trace"):
        profile_trace(tmp_path, audit_a)
    with pytest.raises(shardscope.ProfileError, match="does not exist"):
        profile_trace(tmp_path / "nowhere", audit_a)
    with jax.profiler.trace(str(tmp_path / "idle")):
        pass
    with pytest.raises(shardscope.ProfileError, match="holds no device events"):
        profile_trace(tmp_path / "idle", audit_a)


def test_a_step_that_fails_to_run_writes_nothing(tmp_path):
    def refuse(x):
        raise RuntimeError("no such batch")

    @jax.jit
    def step(x):  # on one device: a device that fails a collective leaves the others waiting
        return jnp.sum(jax.pure_callback(refuse, jax.ShapeDtypeStruct(x.shape, x.dtype), x))

    x = jax.ShapeDtypeStruct((16,), jnp.float32)
    with pytest.raises(shardscope.ProfileError, match="failed to run.*warm-up run 1"):
        profile(step, x, steps=2, trace_dir=tmp_path / "kept")
    assert not (tmp_path / "kept").exists()


def test_the_command_line_refuses_half_a_request(capsys, tmp_path):
    assert_usage_error(["profile"], "FILE.py:FUNCTION", capsys)
    assert_usage_error(["profile", "--trace", str(tmp_path)], "--audit FILE", capsys)
    line = assert_usage_error(
        [
            "profile",
            "--trace",
            str(tmp_path),
            "--audit",
            str(tmp_path / "a.json"),
            "--json",
            str(tmp_path / "p.json"),
        ],
        "audit file",
        capsys,
    )
    assert "does not exist" in line
    assert not (tmp_path / "p.json").exists()


# -- a GPU-shaped trace: device planes, kernels on streams, no run ids ----------------------


def _gpu_trace(path: Path, module: str, kernels: list[tuple[int, str, int, int]]) -> None:
    """Writes an XSpace of ``/device:GPU:N`` planes holding ``kernels`` (device, hlo_op,
    start us, end us) on one stream each, as JAX's GPU tracer records them."""
    planes = []
    for device in sorted({k[0] for k in kernels}):
        events = "".join(
            f"events {{ metadata_id: 1 offset_ps: {a * 10**6} duration_ps: {(b - a) * 10**6} "
            f'stats {{ metadata_id: 10 str_value: "{op}" }} '
            f'stats {{ metadata_id: 11 str_value: "{module}" }} }} '
            for d, op, a, b in kernels
            if d == device
        )
        planes.append(
            f'planes {{ id: {device + 1} name: "/device:GPU:{device}" '
            f'lines {{ id: 1 name: "Stream #13" timestamp_ns: 0 {events}}} '
            f'event_metadata {{ key: 1 value {{ id: 1 name: "kernel" }} }} '
            f'stat_metadata {{ key: 10 value {{ id: 10 name: "hlo_op" }} }} '
            f'stat_metadata {{ key: 11 value {{ id: 11 name: "hlo_module" }} }} }}'
        )
    xspace = jax.profiler.ProfileData.text_proto_to_serialized_xspace(" ".join(planes))
    path.mkdir(parents=True)
    (path / "gpu.xplane.pb").write_bytes(xspace)


def test_a_gpu_trace_joins_by_device_planes_and_measures_the_union(two_programs, tmp_path):
    _, audit_a, _ = two_programs
    (collective,) = audit_a.collectives
    entry = audit_a.module.computations[audit_a.module.entry_name]
    first, later = [
        i.name for i in entry.instructions if i.opcode not in ("parameter", "all-reduce")
    ][:2]
    kernels = []
    for device in range(2):
        for step in range(STEPS):
            t = 100 * step
            # compute 0-20 us, the collective 10-40 us (20 us of it exposed), compute 50-60 us
            kernels += [
                (device, first, t, t + 20),
                (device, collective.name, t + 10, t + 40),
                (device, later, t + 50, t + 60),
            ]
    _gpu_trace(tmp_path / "gpu", audit_a.module_name, kernels)
    p = profile_trace(tmp_path / "gpu", audit_a)
    assert (p.steps, p.devices, p.backend) == (STEPS, 2, "cpu")
    (c,) = p.collectives
    assert c.events == STEPS * 2
    assert c.time_s == pytest.approx(30e-6) and c.exposed_s == pytest.approx(20e-6)
    s = p.step
    assert s.step_s == pytest.approx(60e-6)
    assert s.compute_s == pytest.approx(30e-6) and s.comm_s == pytest.approx(30e-6)
    assert s.exposed_s == pytest.approx(20e-6) and s.idle_s == pytest.approx(10e-6)
    assert math.isclose(sum(b - a for a, b in p.timeline[0].exposed), 20e-6)
