"""Small shared helpers for the tests."""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import numpy as np


def assert_usage_error(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str], *, quiet: bool = True
) -> str:
    """``shardscope ARGV`` is a user error: one line on stderr naming ``words``, exit code 2,
    no traceback, and (``quiet``) nothing on stdout. Returns the line."""
    from shardscope._src.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" or not quiet, captured.out
    assert captured.err.count("\n") == 1, captured.err
    assert words in captured.err and "Traceback" not in captured.err
    return captured.err


def sub_parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    """The parser of the sub-command ``path`` (``("audit", "matmul")``) of a fresh
    ``shardscope`` parser."""
    from shardscope._src.cli.main import build_parser

    parser = build_parser()
    for word in path:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


def read_png(path: str | os.PathLike[str]) -> np.ndarray:
    """The PNG at ``path`` read back as a ``(height, width, 3)`` array of RGB bytes (fails if
    the file is not a PNG)."""
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", image.format
        return np.asarray(image.convert("RGB"))


def assert_drawn(image: np.ndarray, width: int, height: int) -> None:
    """``image`` is ``width`` x ``height`` pixels and not blank: more than 1% of it is not
    white, in more than two colours."""
    import numpy as np

    assert image.shape[:2] == (height, width), image.shape
    inked = np.any(image < 250, axis=-1)
    assert inked.mean() > 0.01, f"{inked.mean():.2%} of the image is not white"
    assert len(np.unique(image[inked], axis=0)) > 2


def patches(image: np.ndarray, colour: str) -> list[tuple[slice, slice]]:
    """The connected regions painted exactly in matplotlib colour ``colour`` (``"C0"``,
    ``"gold"``), as ``(rows, columns)`` slices, left to right."""
    import numpy as np
    from matplotlib.colors import to_rgb
    from scipy import ndimage

    rgb = np.round(np.asarray(to_rgb(colour)) * 255).astype(np.uint8)
    labels, _ = ndimage.label(np.all(image == rgb, axis=-1))
    return sorted(ndimage.find_objects(labels), key=lambda s: s[1].start)


def bars(image: np.ndarray, colour: str) -> list[int]:
    """The heights in pixels of the bars of ``colour`` in a bar chart, left to right: its
    patches that stand on the common baseline (the legend's patch lies elsewhere)."""
    from collections import Counter

    found = patches(image, colour)
    if not found:
        return []
    baseline = Counter(rows.stop for rows, _ in found).most_common(1)[0][0]
    return [rows.stop - rows.start for rows, _ in found if rows.stop == baseline]


def example_code(path: str, heading: str) -> str:
    """The code of the section under ``heading`` (a heading line that starts with it) of a
    Markdown file of the repository (``README.md``, ``docs/guides/own_program.md``): its first
    ``python`` block, or in a MyST notebook every code cell of the section, in order, up to
    the next heading of the same level or above."""
    import re

    lines = (Path(__file__).parent.parent / path).read_text().splitlines(keepends=True)
    level = len(heading) - len(heading.lstrip("#"))
    section: list[str] = []
    inside, fenced = False, False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#+ ", line):  # a heading, not a comment in a cell
            if inside and len(line) - len(line.lstrip("#")) <= level:
                break
            inside = inside or line.startswith(heading)
            if line.startswith(heading):
                continue
        if inside:
            section.append(line)
    assert inside, f"{path} has no heading {heading!r}"
    section = "".join(section)
    cells = re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```", section, re.M | re.S)
    if cells:
        # a cell's options (":tags: [...]") are not code
        return "\n".join(re.sub(r"\A(?::[^\n]*\n)+", "", c) for c in cells)
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, f"{path}: no python block under {heading!r}"
    return found.group(1)


def run_example(code: str, tmp_path: Path) -> str:
    """Runs ``code`` as a script in a fresh interpreter, warnings as errors, in ``tmp_path``;
    returns what it printed."""
    import subprocess
    import sys

    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_doc_example(path: str, heading: str, tmp_path: Path) -> str:
    """Runs the example under ``heading`` of the Markdown file ``path`` (see
    :func:`example_code`) as written; returns what it printed."""
    return run_example(example_code(path, heading), tmp_path)


#: The users' programs the suite runs (Flax, Equinox and plain JAX, as their projects write them).
PROGRAMS = Path(__file__).parent / "programs"


def program_module(name: str):
    """The module ``tests/programs/NAME.py``, imported as its own module."""
    import importlib
    import sys

    if str(PROGRAMS) not in sys.path:
        sys.path.insert(0, str(PROGRAMS))
    return importlib.import_module(name)


#: One layer with experts, the expert compositions' tests' model: 8 sequences of 16 tokens, 8
#: experts of 32 (top 2) and a shared one, on a mesh of 2 x 2 x 2.
SMALL_MIXTURE = dict(
    d_model=64, heads=4, ff=128, layers=1, batch=8, seq=16, vocab=256, mlp="swiglu",
    experts=8, top_k=2, expert_ff=32, shared_experts=1, capacity_factor=1.0,
)  # fmt: skip


def small_mixture(**overrides):
    """:data:`SMALL_MIXTURE` as a ``ModelConfig``, with ``overrides``."""
    from shardscope._src.model.config import ModelConfig

    return ModelConfig(**{**SMALL_MIXTURE, **overrides})


def bound_bytes(bound, keys) -> dict:
    """The bytes ``bound``'s terms move under each of ``keys`` (``(kind, axes, scope)``), its
    terms' counts times their payloads summed; keys no term has are left out."""
    out: dict = {}
    for t in bound.terms:
        key = (t.kind, t.axes, t.scope)
        if key in keys:
            out[key] = out.get(key, 0) + t.count * t.payload_bytes
    return out


def halves_routing():
    """Hooks under which one device routes each sequence in two groups, its halves (what a
    device of a 2-way ``model`` or ``context`` axis routes)."""
    from shardscope._src.model.transformer import Hooks

    class Halves(Hooks):
        sequence_groups = 2

    return Halves()


def twin_routing_halves(strategy: str, config, mesh: str):
    """``strategy``'s ``shard_map`` twin on ``mesh``, checked to compute the train step one
    device computes routing each sequence in halves (:func:`halves_routing`: where tokens
    are dropped, per slice of a sequence); the program, for its collectives."""
    import jax
    import pytest

    from shardscope._src.model.transformer import init_batch, init_params, loss
    from shardscope._src.sharding.programs import build_reference_program

    params, batch = init_params(config), init_batch(config)
    halves = halves_routing()
    want_loss, want = jax.jit(jax.value_and_grad(lambda p, b: loss(p, b, config, halves)))(
        params, batch
    )
    prog = build_reference_program(strategy, config, mesh, mode="train", impl="shard_map")
    got_loss, got = prog.fn(*prog.example_args())
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-5)
    assert max_error(got, want) < 1e-6
    return prog


@functools.cache
def one_device_step(config):
    """``(loss, grads)`` of the reference decoder's train step on one device (jitted, cached
    per config: a ``ModelConfig`` is hashable)."""
    import jax

    from shardscope._src.model.transformer import init_batch, init_params, loss

    params, batch = init_params(config), init_batch(config)
    return jax.jit(jax.value_and_grad(loss), static_argnums=2)(params, batch, config)


def assert_one_device_step(loss, grads, config) -> None:
    """``loss`` and ``grads`` are the reference decoder's train step on one device's
    (:func:`one_device_step`), within the tolerance of ``config``'s dtype."""
    import jax

    from shardscope._src.sharding.numerics import TOLERANCES, relative_error

    want_loss, want_grads = one_device_step(config)
    assert relative_error(loss, want_loss) <= TOLERANCES[config.dtype]
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads), strict=True):
        assert relative_error(got, want) <= TOLERANCES[config.dtype]


def max_error(a, b) -> float:
    """The largest absolute difference between two pytrees of arrays, in float32 (on the
    host: no compile per shape)."""
    import jax
    import numpy as np

    return max(
        float(np.max(np.abs(np.asarray(x, np.float32) - np.asarray(y, np.float32))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def layer_growth(strategy: str, mesh_spec: str, config_of) -> tuple[int, float]:
    """``(estimate, compiled)``: what one layer keeps for the backward by the memory estimate
    (the same at 2 and 4 layers), and how much the H100 compiler's temporaries grow per layer
    of the scan from ``config_of(2)`` to ``config_of(4)`` (train step, FSDP's weights gathered
    again for the backward, as the planner compiles it)."""
    import shardscope
    from shardscope._src.audit.compile import audit
    from shardscope._src.plan.estimates import activation_bytes_per_layer
    from shardscope._src.sharding.programs import build_reference_program
    from shardscope._src.sharding.strategies import get_strategy

    mesh = shardscope.target_mesh("h100", mesh_spec, axis_types="auto")
    temp, per_layer = {}, {}
    for layers in (2, 4):
        placement = get_strategy(strategy).place(config_of(layers), mesh)
        program = build_reference_program(placement, mode="train", regather=True)
        temp[layers] = audit(program.lower()).memory["temp_size_in_bytes"]
        per_layer[layers] = activation_bytes_per_layer(placement)
    assert per_layer[2] == per_layer[4]
    return per_layer[2], (temp[4] - temp[2]) / 2


#: The Flax MLP program of ``tests/programs`` (named axes, three hand-written rule sets).
MLP = f"{PROGRAMS / 'flax_mlp.py'}:make_step"


@functools.cache
def mlp_search():
    """``(make_step, result)``: the MLP program and ``shardscope.suggest``'s search of it on 8
    devices (Auto axes, 4 compiles, in this process), searched once per process for the tests
    that read it or compare another search with it (test_suggest, test_suggest_ray)."""
    import shardscope
    from shardscope._src.audit.user_program import load_program

    make_step = load_program(MLP)
    return make_step, shardscope.suggest(make_step, 8, axis_types="auto", compiles=4, workers=0)
