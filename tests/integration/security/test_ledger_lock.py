"""Issue 39: a user cannot skip every ingest by holding the lock of docs/ledger.md's cron recipe.
``flock`` works on a read-only descriptor, so the recipe's lock must be one no user can open: the
test takes the ingest line from the page, runs it as root (into a ledger of its own), leaves the
lock readable (as a run by hand without ``umask 077`` does) in a data directory others may enter
(as /var/lib/gpuhpc is), lets the throwaway user try to hold it, and runs the line again."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _cron_line(what: str) -> str:
    """The command of the cron entry that runs ``gpuhpc ledger WHAT`` (after the user field)."""
    block = re.search(r"```cron\n(.*?)```", (REPO / "docs/ledger.md").read_text(), re.S).group(1)
    line = next(ln for ln in block.splitlines() if f" gpuhpc ledger {what} " in ln)
    return line.split(" root ", 1)[1]


def test_a_user_cannot_hold_the_cron_recipes_ingest_lock(hostile):
    data = Path(tempfile.mkdtemp(prefix="gpuhpc-sec-ledger-", dir="/var/tmp"))
    data.chmod(0o755)
    gpuhpc = str(Path(sys.executable).parent / "gpuhpc")
    line = (_cron_line("ingest").replace("/var/lib/gpuhpc", str(data))
            .replace("/var/log/gpuhpc-ledger.log", str(data / "ledger.log"))
            .replace(" gpuhpc ledger ingest", f" {gpuhpc} ledger ingest --since 10m"))
    lock = Path(re.search(r"flock -n (\S+)", line).group(1))
    env = {k: v for k, v in os.environ.items() if k != "GPUHPC_DB_URL"}
    env["GPUHPC_DATA_DIR"] = str(data)
    holder = None
    try:
        subprocess.run([gpuhpc, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
        first = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=300)
        assert first.returncode == 0 and lock.exists(), (first.stderr, (data / "ledger.log").read_text())
        lock.chmod(0o644)
        # the attack: a shared lock on a read-only descriptor, held for as long as the user likes
        holder = subprocess.Popen(["runuser", "-u", hostile.name, "--", "flock", "-n", "-s", str(lock),
                                   "sh", "-c", "echo locked; exec sleep 300"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        assert holder.stdout.readline().strip() != "locked", f"{hostile.name} holds {lock}"
        assert holder.wait(timeout=60) != 0 and "Permission denied" in holder.stderr.read()
        size = (data / "ledger.log").stat().st_size
        again = subprocess.run(["sh", "-c", line], env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 0, again.stderr               # flock -n exits 1 when the lock is held
        assert (data / "ledger.log").stat().st_size > size        # the ingest ran and said so
    finally:
        if holder is not None and holder.poll() is None:
            os.killpg(holder.pid, 9)
            holder.wait()
        subprocess.run(["rm", "-rf", str(data)], timeout=60)
