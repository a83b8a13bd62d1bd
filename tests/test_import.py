"""``import shardscope`` is light and changes nothing in its process; each public name loads
on first use; the deviceless set-up waits until a compile target is asked for."""

import ast
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import shardscope
from shardscope._src.targets.devices import compiler_installed

INIT = Path(shardscope.__file__)
UNSET = (
    "XLA_FLAGS",
    "JAX_NUM_CPU_DEVICES",
    "JAX_SKIP_CUDA_CONSTRAINTS_CHECK",
    "TPU_ACCELERATOR_TYPE",
    "TPU_WORKER_HOSTNAMES",
    "ALLOW_MULTIPLE_LIBTPU_LOAD",
)


def _run(code: str, **env: str) -> dict:
    """Runs ``code`` in a new Python, inheriting none of the variables shardscope or the suite
    may set; it prints one JSON object as its last line."""
    clean = {k: v for k, v in os.environ.items() if k not in UNSET}
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**clean, **env},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_changes_no_environment_and_no_file_descriptor():
    got = _run(
        "import json, os, sys\n"
        "calls = []\n"
        "for name in ('dup', 'dup2', 'close', 'putenv', 'unsetenv'):\n"
        "    real = getattr(os, name)\n"
        "    setattr(os, name, lambda *a, _n=name, _r=real: (calls.append(_n), _r(*a))[1])\n"
        "before = dict(os.environ)\n"
        "import shardscope\n"
        "print(json.dumps({'same': dict(os.environ) == before, 'calls': calls,\n"
        "    'jax': 'jax' in sys.modules,\n"
        "    'ours': sorted(m for m in sys.modules if m.startswith('shardscope'))}))\n"
    )
    assert got == {"same": True, "calls": [], "jax": False, "ours": ["shardscope"]}


def test_loading_every_module_adds_nothing_to_the_environment():
    # JAX's own import sets a few variables where libtpu is installed (TPU_LIBRARY_PATH, ...):
    # the comparison starts after it.
    got = _run(
        "import json, os\n"
        "import jax\n"
        "before = dict(os.environ)\n"
        "import shardscope, shardscope.taster\n"
        "for name in shardscope.__all__:\n"
        "    getattr(shardscope, name)\n"
        "from shardscope._src.cli.main import build_parser\n"
        "build_parser()\n"
        "after = dict(os.environ)\n"
        "print(json.dumps({'added': sorted(set(after) - set(before)),\n"
        "    'changed': sorted(k for k in before if after.get(k) != before[k])}))\n"
    )
    assert got == {"added": [], "changed": []}


def test_every_public_name_loads_from_the_module_it_names():
    tree = ast.parse(INIT.read_text())
    checked = next(n for n in tree.body if isinstance(n, ast.If))  # if TYPE_CHECKING:
    typed = {
        a.asname: (f"{n.module}.{a.name}" if n.module == "shardscope" else n.module, a.name)
        for n in checked.body
        if isinstance(n, ast.ImportFrom)
        for a in n.names
    }
    exports = {k: v for k, v in shardscope._EXPORTS.items() if k != "__version__"}
    assert {k: v[0] for k, v in exports.items()} == {
        k: m for k, (m, _) in typed.items() if k != "_VERSION"
    }
    for name, (module, attr) in exports.items():
        found = importlib.import_module(module)
        assert getattr(shardscope, name) is (found if attr is None else getattr(found, attr))
    assert shardscope.__version__ == importlib.import_module("shardscope._src.base.records").VERSION
    assert set(shardscope.__all__) <= set(dir(shardscope))


def test_a_record_finds_its_renderer_only_when_it_is_shown():
    # Records import no renderer: rich and notebooks reach the renderer of a layout, an audit
    # and a diff through the display registry, which loads the renderer when one is shown.
    got = _run(
        "import io, json, sys\n"
        "import jax, jax.numpy as jnp\n"
        "from jax.sharding import NamedSharding, PartitionSpec as P\n"
        "from rich.console import Console\n"
        "import shardscope\n"
        "mesh = shardscope.make_mesh('data=1')\n"
        "lay = shardscope.layout((4, 4), NamedSharding(mesh, P('data')), dtype='float32')\n"
        "x = jax.ShapeDtypeStruct((4, 4), jnp.float32)\n"
        "audit = shardscope.audit(jax.jit(lambda x: x * 2), x, mesh='data=1')\n"
        "diff = shardscope.diff_audits(audit, audit)\n"
        "def loaded():\n"
        "    return sorted(m for m in sys.modules if m.startswith('shardscope._src.render'))\n"
        "before = loaded()\n"
        "def text(renderable):\n"
        "    console = Console(width=120, file=io.StringIO(), record=True)\n"
        "    console.print(renderable)\n"
        "    return console.export_text()\n"
        "shown = [text(lay), text(audit), text(diff)]\n"
        "bundles = [lay._repr_mimebundle_(), audit._repr_mimebundle_()]\n"
        "printed = str(audit)\n"
        "from shardscope._src.render.audit import audit_mimebundle, audit_table\n"
        "from shardscope._src.render.diff import diff_table\n"
        "from shardscope._src.render.layout import layout_mimebundle, layout_table\n"
        "drawn = [text(layout_table(lay)), text(audit_table(audit)), text(diff_table(diff))]\n"
        "print(json.dumps({'before': before, 'after': loaded(),\n"
        "    'same': [a == b for a, b in zip(shown, drawn)],\n"
        "    'bundles': [bundles[0] == layout_mimebundle(lay),\n"
        "                bundles[1] == audit_mimebundle(audit)],\n"
        "    'printed': printed == bundles[1]['text/plain'],\n"
        "    'repr': repr(audit).startswith('Audit(collectives=')}))\n"
    )
    assert got["before"] == []
    assert {"shardscope._src.render.layout", "shardscope._src.render.audit"} <= set(got["after"])
    assert "shardscope._src.render.diff" in got["after"]
    assert got["same"] == [True, True, True]
    assert got["bundles"] == [True, True]
    # print(audit) shows the notebook's plain-text table; repr keeps the fields
    assert got["printed"] and got["repr"]


def test_no_module_imports_one_that_imports_it_back():
    # Every import grimp finds counts: at the top, inside functions and under TYPE_CHECKING.
    import grimp

    graph = grimp.build_graph("shardscope", cache_dir=None)
    circles = set()
    for importer in graph.modules:
        for imported in graph.find_modules_directly_imported_by(importer):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                circles.add(" -> ".join((importer, *back)))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))


def test_no_module_imports_a_private_name_of_another():
    # A name with a leading underscore belongs to its module; another module that needs it
    # needs it made public where it lives.
    found = []
    for path in sorted(INIT.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("shardscope"):
                private = [a.name for a in node.names if a.name.startswith("_")]
                found += [f"{path.relative_to(INIT.parent)}: {node.module}.{n}" for n in private]
    assert found == []


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="module 'shardscope' has no attribute 'plot'"):
        shardscope.plot  # noqa: B018


@pytest.mark.skipif(not compiler_installed("h100"), reason="needs the gpu-compile extra")
def test_a_target_after_a_computation_gets_the_deviceless_set_up():
    # The set-up runs when the target is asked for, even after JAX has started (and its CUDA
    # plugin has refused to register without a driver): the target still compiles.
    got = _run(
        "import json, os\n"
        "import shardscope, jax, jax.numpy as jnp\n"
        "jnp.zeros(1).block_until_ready()\n"
        "before = dict(os.environ)\n"
        "audit = shardscope.audit(jax.jit(lambda x: x.sum()),\n"
        "    jax.ShapeDtypeStruct((8, 128), jnp.float32), mesh='data=8', target='h100',\n"
        "    in_shardings=jax.sharding.PartitionSpec('data'))\n"
        "print(json.dumps({'kinds': sorted({c.kind for c in audit.collectives}),\n"
        "    'added': sorted(set(os.environ) - set(before))}))\n"
    )
    assert got["kinds"] == ["all-reduce"]
    if not (os.path.exists("/proc/driver/nvidia/version")):
        assert "JAX_SKIP_CUDA_CONSTRAINTS_CHECK" in got["added"]
