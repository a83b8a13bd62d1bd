"""The docs' one directive: ``{terminal}`` runs shell commands at build time and shows each
with what it printed, as a terminal would (standard output and error together, no colour).

    ```{terminal}
    :returncode: 1
    shardscope diff main.json new.json --no-new all-gather
    ```

``:figure: PATH`` shows a PNG one of the commands wrote; ``:copy: SOURCE DEST`` first copies a
file of the repository (``SOURCE``, from its root) into the folder as ``DEST``. Each line is one
command, run by bash in a folder of its own for the page (under ``_build/terminal``), so a
later command reads the files an earlier one of the same page wrote. A command that exits
otherwise than ``:returncode:`` (default 0) fails the build, naming the page, the command and
its output. Guides' Python runs in their notebook kernels; this is for the command line, whose
output a notebook kernel would colour and cut at 80 columns.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

LOG = logging.getLogger(__name__)

#: Variables a notebook kernel or CI sets that make a program colour its output or wrap it.
_COLOUR = ("FORCE_COLOR", "CLICOLOR_FORCE", "CLICOLOR", "TERM", "COLUMNS", "JPY_PARENT_PID")


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _COLOUR}
    env["NO_COLOR"] = "1"
    env["TERM"] = "dumb"
    return env


class Terminal(SphinxDirective):
    has_content = True
    option_spec = {
        "returncode": directives.nonnegative_int,
        "timeout": directives.positive_int,
        "figure": directives.unchanged,
        "copy": directives.unchanged,
    }

    def run(self) -> list[nodes.Node]:
        # Inside the source folder (whatever the output folder), so that a figure a command
        # drew is an image Sphinx copies like any other.
        folder = Path(self.env.srcdir) / "_build" / "terminal" / self.env.docname
        if self.env.docname not in self.env.temp_data.setdefault("terminal_started", set()):
            shutil.rmtree(folder, ignore_errors=True)
            self.env.temp_data["terminal_started"].add(self.env.docname)
        folder.mkdir(parents=True, exist_ok=True)
        if "copy" in self.options:
            # ``SOURCE DEST``: a file of the repository the commands read, under the name a
            # user would give it (the page shows it with a literalinclude of SOURCE).
            source, dest = self.options["copy"].split()
            shutil.copyfile(Path(self.env.srcdir).parent / source, folder / dest)
        expected = self.options.get("returncode", 0)
        shown = []
        for command in (line for line in self.content if line.strip()):
            start = time.perf_counter()
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=folder,
                env=_environment(),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=self.options.get("timeout", 600),
            )
            took = time.perf_counter() - start
            LOG.info(f"[terminal] {self.env.docname}: {command} ({took:.1f} s)")
            if done.returncode != expected:
                # A warning, which -W makes fatal, rather than an exception: a parallel build
                # would report an exception without the command's output.
                LOG.warning(
                    f"`{command}` exited {done.returncode}, not {expected}:\n{done.stdout}",
                    location=self.get_location(),
                )
            shown.append(f"$ {command}\n{done.stdout.rstrip()}")
        text = "\n\n".join(shown)
        block = nodes.literal_block(text, text, language="text")
        block["classes"].append("terminal")
        shown_nodes: list[nodes.Node] = [block]
        if "figure" in self.options:
            # A picture a command drew, by its path in the page's folder (inside the source
            # folder, so Sphinx copies it like any image).
            path = folder / self.options["figure"]
            if not path.is_file():
                LOG.warning(f"no {path} was written", location=self.get_location())
                return shown_nodes
            uri = "/" + path.relative_to(Path(self.env.srcdir)).as_posix()
            shown_nodes.append(nodes.image(uri=uri, alt=self.options["figure"]))
        return shown_nodes


def setup(app: Sphinx) -> dict[str, object]:
    app.add_directive("terminal", Terminal)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
