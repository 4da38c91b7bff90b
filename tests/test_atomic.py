"""mgg.atomic: temporary names that tell a dead writer's leftovers from a live one's,
and the lock that keeps one job per output."""

import os
import subprocess
import sys

import pytest

from mgg.atomic import LockedError, atomic_write, hold, is_temporary, stale, sweep, temp_path


def test_a_dead_writers_temporaries_are_swept_and_a_live_ones_kept(tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "from mgg.atomic import temp_path; print(temp_path('x.pt'))"],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    ).stdout.strip()  # fmt: skip
    (tmp_path / dead).write_bytes(b"half")
    folder = temp_path(tmp_path / "out")  # the dead writer's folder-shaped leftover too
    folder = folder.with_name(folder.name.replace(f"-{os.getpid()}-", "-999999999-"))
    (folder / "rank-0000").mkdir(parents=True)
    live = temp_path(tmp_path / "y.pt")  # this process is alive
    live.write_bytes(b"mine")
    (tmp_path / ".tmp-notours").write_bytes(b"?")  # not a name temp_path makes
    (tmp_path / "z.pt").write_bytes(b"done")
    assert is_temporary(live) and not is_temporary(tmp_path / "z.pt")
    assert sorted(p.name for p in stale(tmp_path)) == sorted([dead, folder.name])
    assert sorted(p.name for p in sweep(tmp_path)) == sorted([dead, folder.name])
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([live.name, ".tmp-notours", "z.pt"])


def test_atomic_write_leaves_nothing_when_the_block_fails(tmp_path):
    with pytest.raises(RuntimeError), atomic_write(tmp_path / "a.npy") as tmp:
        open(tmp, "w").write("partial")
        raise RuntimeError
    assert list(tmp_path.iterdir()) == []


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    lk = hold(tmp_path / ".lock", "output D")
    code = f"from mgg.atomic import hold; hold({str(tmp_path / '.lock')!r}, 'output D')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode != 0 and "LockedError: output D is in use by another job" in r.stderr
    assert f"(pid {os.getpid()} on " in r.stderr
    with pytest.raises(LockedError):  # a second open file in the same process too
        hold(tmp_path / ".lock", "output D")
    lk.release()
    hold(tmp_path / ".lock", "output D").release()
