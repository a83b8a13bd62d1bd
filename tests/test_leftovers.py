"""Temporary files of a killed run are removed by the next write to their folder: only ours
(by name), only stale (their process gone, or untouched for a day), never a running writer's."""

import os
import signal
import subprocess
import sys
import time

from shardscope._src.base import io
from shardscope._src.base.io import STALE_AFTER_S, STALE_ELSEWHERE_AFTER_S, write_atomic

KILLED_WRITE = """
import os, signal, sys
from shardscope._src.base.io import write_atomic
def write(f):
    f.write("half")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # killed between writing and renaming
write_atomic(sys.argv[1], write)
"""


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def leftover(folder, name: str, *, idle_s: float):
    path = folder / name
    path.write_text("x")
    t = time.time() - idle_s
    os.utime(path, (t, t))
    return path


def test_a_killed_writes_leftover_is_removed_by_the_next_write(tmp_path):
    target = tmp_path / "out.json"
    p = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(target)], check=False)
    assert p.returncode == -signal.SIGKILL
    (left,) = [q for q in tmp_path.iterdir()]
    assert left.name.startswith(".out.json.shardscope-") and left.name.endswith(".tmp")
    assert not target.exists()
    write_atomic(target, lambda f: f.write("new"))
    assert left.exists()  # just now touched: it could still be a writer's
    t = time.time() - STALE_AFTER_S - 1
    os.utime(left, (t, t))
    write_atomic(target, lambda f: f.write("newer"))
    assert sorted(q.name for q in tmp_path.iterdir()) == ["out.json"]
    assert target.read_text() == "newer"


def test_only_stale_files_of_ours_are_removed(tmp_path):
    host, old = io._HOST, STALE_AFTER_S + 5
    gone, alive = dead_pid(), os.getppid()
    remove = [
        leftover(tmp_path, f".a.json.shardscope-{host}-{gone}-x1.tmp", idle_s=old),
        leftover(tmp_path, f".shardscope-probe-{host}-{gone}-q9", idle_s=old),
        leftover(
            tmp_path,
            f".b.png.shardscope-0000ffff-{alive}-y2.tmp",
            idle_s=STALE_ELSEWHERE_AFTER_S + 5,
        ),
    ]
    keep = [
        leftover(tmp_path, f".a.json.shardscope-{host}-{alive}-z3.tmp", idle_s=old),  # alive
        leftover(tmp_path, f".a.json.shardscope-{host}-{os.getpid()}-w4.tmp", idle_s=old),
        leftover(tmp_path, f".a.json.shardscope-{host}-{gone}-v5.tmp", idle_s=1),  # fresh
        leftover(tmp_path, f".b.png.shardscope-0000ffff-{gone}-u6.tmp", idle_s=3600),
        leftover(tmp_path, ".a.json.abcdefgh.tmp", idle_s=10 * STALE_ELSEWHERE_AFTER_S),
        leftover(tmp_path, "notes.txt", idle_s=10 * STALE_ELSEWHERE_AFTER_S),
        leftover(tmp_path, f"shardscope-{host}-{gone}-t7.tmp", idle_s=old),  # not hidden
    ]
    (tmp_path / f".d.shardscope-{host}-{gone}-s8.tmp").mkdir()  # a folder is never removed
    write_atomic(tmp_path / "result.json", lambda f: f.write("{}"))
    assert not any(p.exists() for p in remove)
    assert all(p.exists() for p in keep)
    assert (tmp_path / f".d.shardscope-{host}-{gone}-s8.tmp").is_dir()
