"""Point 8: a user cannot squat the deep-check slots (scheduled checks would never run, drained
nodes never return): ``flock`` works on a read-only descriptor, so the slots live in a root-only
directory, 0600, and a slot directory the user made or can write is refused."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuhpc.health.deep import Slot


def test_the_user_cannot_hold_a_slot_of_roots(hostile):
    parent = Path(tempfile.mkdtemp(prefix="gpuhpc-sec-slots-", dir="/var/tmp"))
    parent.chmod(0o755)
    slots = parent / "deep-slots"
    first = Slot(str(slots), 1)
    assert first.acquire()                     # root makes the directory and the slot
    first.release()
    try:
        r = hostile.run(["flock", "-n", "-s", str(slots / "deep-slot-0"), "true"])
        assert r.returncode != 0 and "Permission denied" in r.stderr, (r.returncode, r.stderr)
        again = Slot(str(slots), 1)
        assert again.acquire()                 # nothing held by the user
        again.release()
    finally:
        subprocess.run(["rm", "-rf", str(parent)], timeout=60)


def test_a_slot_directory_the_user_made_is_refused(hostile):
    slots = hostile.workdir / "deep-slots"
    assert hostile.run(["mkdir", "-m", "777", str(slots)]).returncode == 0
    assert hostile.run(["chmod", "777", str(slots)]).returncode == 0
    holder = subprocess.Popen(["runuser", "-u", hostile.name, "--", "flock", "-x", str(slots / "deep-slot-0"),
                               "sh", "-c", "echo locked; exec sleep 300"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        res = subprocess.run([sys.executable, "-m", "gpuhpc.health", "--mode", "deep", "--apply", "--slots", str(slots),
                              "--cap", "1", "--node", "gpu-node1"], env=dict(os.environ), capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
        assert "must be a directory owned by uid 0" in res.stderr
        assert sorted(os.listdir(slots)) == ["deep-slot-0"]     # root created nothing there
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
