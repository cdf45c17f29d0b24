"""Point 6: another user's job log (and everything else under the gpuhpc data dir: checkpoints,
pickled calls, results) cannot be read: the data dir is created 0700 and gpuhpc's own files in
it are 0600."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuhpc import fsutil
from polling import wait_for


def test_a_job_log_in_the_data_dir_is_not_readable_by_another_user(hostile):
    home = Path(tempfile.mkdtemp(prefix="gpuhpc-sec-victim-", dir="/var/tmp"))
    home.chmod(0o755)                             # a home others may enter, as most are
    data = home / ".local" / "share" / "gpuhpc"
    env = {**os.environ, "GPUHPC_DATA_DIR": str(data)}
    env.pop("GPUHPC_LOG_DIR", None)
    job = None
    try:
        res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--no-snapshot", "-p", "cpu", "-t", "2m",
                              "-J", "gpuhpc-sec-log", "--", "bash", "-c", "echo secret-token-26"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        job = res.stdout.strip().splitlines()[-1]
        log = data / "logs" / f"gpuhpc-sec-log-{job}.out"
        wait_for(lambda: log.exists() and "secret-token-26" in log.read_text(), 120, f"job {job}'s log at {log}")
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        # the attack: read the log, list the directory, find its name some other way
        for argv in (["cat", str(log)], ["ls", str(data / "logs")], ["ls", str(data)]):
            r = hostile.run(argv)
            assert r.returncode != 0 and "Permission denied" in r.stderr and "secret-token-26" not in r.stdout, argv
        # gpuhpc's own writes there are the owner's only
        fsutil_file = data / "sweeps" / "x" / "fn.pkl"
        env_code = f"from gpuhpc.fsutil import write_atomic; write_atomic({str(fsutil_file)!r}, b'pickled')"
        subprocess.run([sys.executable, "-c", env_code], env=env, check=True, timeout=60)
        assert stat.S_IMODE(fsutil_file.stat().st_mode) == 0o600
        assert hostile.run(["cat", str(fsutil_file)]).returncode != 0
    finally:
        if job:
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
        subprocess.run(["rm", "-rf", str(home)], timeout=60)


def test_the_data_dir_is_created_private(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path / "d"))
    assert stat.S_IMODE(fsutil.data_dir().stat().st_mode) == 0o700
