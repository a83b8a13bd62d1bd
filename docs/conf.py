"""Sphinx configuration of shardscope's docs (``make docs``).

The stack JAX, Flax and Orbax build their sites with: Sphinx, the book theme, MyST-NB
executing every guide (MyST Markdown notebooks) at each build, autosummary and napoleon for
the API reference of the public facade, and sphinx-argparse for the command-line reference,
read from the parser itself. Every table and figure is an output of the build, or rendered
from a benchmark's committed JSON (``benchmarks/results/``).
"""

from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))

# The {terminal} blocks run the command of the environment that builds the docs, as a user's
# shell finds it once the package is installed.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# The reference pages' kernels read the docs' table helpers and the benchmarks' runs.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(DOCS / "_ext"), str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]
).rstrip(os.pathsep)

import shardscope  # noqa: E402  (after the path is set)

project = "shardscope"
author = "the shardscope developers"
copyright = "the shardscope developers"  # noqa: A001
release = version = shardscope.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinxarg.ext",
    "shardscope_docs",  # the {terminal} directive: commands run at build time
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md", "jupyter_execute"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb"}
root_doc = "index"
# "--flag" stays two hyphens in prose and in the tables' messages.
smartquotes = False

# -- MyST and MyST-NB: every guide executed at every build -------------------------------
myst_enable_extensions = ["colon_fence", "deflist", "dollarmath"]
myst_heading_anchors = 3
# "force", as JAX's docs build: a cache keyed on the cells' code would keep a table whose
# numbers changed with the library's constants.
nb_execution_mode = os.environ.get("SHARDSCOPE_DOCS_EXECUTE", "force")
nb_execution_timeout = 300  # seconds a cell: the longest (a plan compiled by the H100's compiler)
# A cell that raises is a warning that names the notebook and shows the cell and its
# traceback; -W makes it fail the build. (Raising instead would stop a parallel build with
# the notebook's path alone.)
nb_execution_raise_on_error = False
nb_execution_show_tb = True
nb_execution_in_temp = True  # what a guide writes (scores/, plan.json) stays out of docs/
nb_execution_allow_errors = False
# A guide that writes to stderr (a JAX warning, a plugin's start-up chatter) warns, and -W
# fails the build: what a reader sees is what a user gets.
nb_output_stderr = "warn"
nb_merge_streams = True
nb_render_markdown_format = "myst"
nb_execution_excludepatterns: list[str] = []

# -- API reference --------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# A function that takes a request lists the request's fields under this heading.
napoleon_custom_sections = [("Request fields", "params_style")]

# -- intersphinx: links into JAX's and NumPy's docs where their inventories can be fetched ---
INTERSPHINX = {
    "jax": ("https://docs.jax.dev/en/latest/", None),
    "numpy": ("https://numpy.org/doc/stable/", None),
    "python": ("https://docs.python.org/3/", None),
}


def _reachable(url: str) -> bool:
    host = url.split("/")[2]
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        return False
    return True


# CI reaches the package registries only: there the inventories cannot be fetched, and the
# references render as plain names rather than failing a build that takes warnings as errors.
# SHARDSCOPE_DOCS_INTERSPHINX=1 insists (an unreachable inventory then fails the build), 0
# turns the links off.
_wanted = os.environ.get("SHARDSCOPE_DOCS_INTERSPHINX", "auto")
intersphinx_mapping = {
    name: target
    for name, target in INTERSPHINX.items()
    if _wanted == "1" or (_wanted == "auto" and _reachable(target[0]))
}

# -- HTML -------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = f"shardscope {version}"
html_theme_options = {
    "show_toc_level": 2,
    "repository_url": "",
    "use_repository_button": False,
    "show_navbar_depth": 1,
}
html_static_path = ["_static"]
html_css_files = ["shardscope.css"]


# -- a parallel build that runs the guides in parallel ---------------------------------------
def _work(docname: str) -> int:
    """How much a page runs when it is read: its notebook cells and its commands."""
    path = DOCS / f"{docname}.md"
    text = path.read_text() if path.is_file() else ""
    return text.count("```{code-cell}") + 2 * text.count("```{terminal}")


def _spread_the_guides(app, env, docnames: list[str]) -> None:
    """``-j N`` reads the pages in contiguous chunks of the sorted names, so every guide (all
    under guides/) would run in one process, one after another, while the other reads API
    stubs. Deal the pages that run something over the chunks instead, the most work first."""
    nproc = app.parallel
    if nproc <= 1 or len(docnames) <= 5:
        return
    chunksize = len(docnames) // nproc  # as sphinx.util.parallel.make_chunks sizes them
    if chunksize >= 10:
        chunksize = int(math.sqrt(len(docnames) / nproc * 10))
    chunksize = max(chunksize, 1)
    nchunks = math.ceil(len(docnames) / chunksize)
    busy = sorted((d for d in docnames if _work(d)), key=_work, reverse=True)
    idle = [d for d in docnames if not _work(d)]
    chunks: list[list[str]] = [[] for _ in range(nchunks)]
    for i, name in enumerate(busy):
        chunks[i % nchunks].append(name)
    for chunk in chunks:
        while len(chunk) < chunksize and idle:
            chunk.append(idle.pop(0))
    docnames[:] = [name for chunk in chunks for name in chunk] + idle


def setup(app):
    app.connect("env-before-read-docs", _spread_the_guides)
