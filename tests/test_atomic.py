"""An atomic write leaves either the old file or the whole new one, removes only its own
temporary file, and gives the new file the permissions ``open()`` would."""

import os
import signal
import stat
import subprocess
import sys

import pytest

from shardscope._src.base.atomic import write_atomic
from shardscope._src.base.errors import OutputPathError

KILLED_WRITE = """
import os, signal, sys
from shardscope._src.base.atomic import write_atomic
def write(f):
    f.write("half")
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)  # killed between writing and renaming
write_atomic(sys.argv[1], write)
"""

UMASKED_WRITE = """
import os, sys
os.umask(0o027)
from shardscope._src.base.atomic import write_atomic
write_atomic(sys.argv[1], lambda f: f.write("x"))
print(oct(os.umask(0o022)))
"""


def test_a_killed_write_leaves_the_old_file_whole(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    p = subprocess.run([sys.executable, "-c", KILLED_WRITE, str(target)], check=False)
    assert p.returncode == -signal.SIGKILL
    assert target.read_text() == "old"
    (left,) = [q for q in tmp_path.iterdir() if q != target]
    assert left.name.startswith(".out.json.") and left.name.endswith(".tmp")
    # the next write replaces the file and leaves another process's temporary alone
    write_atomic(target, lambda f: f.write("new"))
    assert target.read_text() == "new" and left.exists()


def test_a_failing_write_removes_its_temporary_and_keeps_the_old_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")

    def write(f):
        f.write("half")
        raise KeyError("the writer failed")

    with pytest.raises(KeyError, match="the writer failed"):
        write_atomic(target, write)
    assert sorted(q.name for q in tmp_path.iterdir()) == ["out.json"]
    assert target.read_text() == "old"


def test_a_new_file_gets_the_mode_of_the_umask_and_the_umask_is_kept(tmp_path):
    target = tmp_path / "out.json"
    p = subprocess.run(
        [sys.executable, "-c", UMASKED_WRITE, str(target)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~0o027
    assert p.stdout.strip() == oct(0o027)  # the umask the writer set is still in force


def test_writing_inside_a_file_names_the_file(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(OutputPathError, match=f"{str(afile)!r} is a file, not a folder"):
        write_atomic(afile / "out.json", lambda f: f.write("x"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_unwritable_folder_is_refused_with_the_path_and_nothing_is_left(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(OutputPathError, match="cannot write .*out.json.*folder you can"):
            write_atomic(folder / "out.json", lambda f: f.write("x"))
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)
