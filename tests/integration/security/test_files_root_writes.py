"""Point 3: root never writes through, or trusts, a path an ordinary user prepared: the Prolog's
job map in a directory the user made (a link planted where the map file goes), and the local
services' fixed /var/tmp/gpuhpc-* directories (sshd would trust the user's key, `stop` would
signal the pid the user wrote)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "root-only"
    victim.write_text("root's file\n")
    victim.chmod(0o600)
    return victim


def test_the_prolog_does_not_write_through_a_users_job_map(hostile, tmp_path):
    tmp_path.chmod(0o755)
    victim = _victim(tmp_path)
    base = hostile.workdir / "jobmap"
    assert hostile.run(["mkdir", "-p", "-m", "777", str(base / "gpu-node1")]).returncode == 0
    assert hostile.run(["ln", "-s", str(victim), str(base / "gpu-node1" / "0")]).returncode == 0
    before = sorted(os.listdir(base / "gpu-node1"))
    env = {**os.environ, "GPUHPC_JOBMAP_DIR": str(base), "SLURMD_NODENAME": "gpu-node1", "SLURM_JOB_ID": "4242",
           "SLURM_JOB_USER": "root", "SLURM_JOB_GPUS": "0,1"}
    for hook in ("prolog", "epilog"):
        res = subprocess.run([sys.executable, "-m", "gpuhpc.monitoring.jobmap", hook], env=env,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 1 and res.stderr.count("\n") == 1 and "must be a directory owned by uid 0" in res.stderr, \
            res.stderr
    assert victim.read_text() == "root's file\n" and (victim.stat().st_mode & 0o777) == 0o600
    assert sorted(os.listdir(base / "gpu-node1")) == before and (base / "gpu-node1" / "0").is_symlink()


@pytest.mark.parametrize("service", ["sshd", "s3", "postgres", "prometheus"])
def test_a_service_refuses_a_directory_a_user_prepared(hostile, service):
    victim = subprocess.Popen(["sleep", "300"])
    d = hostile.workdir / f"svc-{service}"
    try:
        assert hostile.run(["mkdir", "-m", "755", str(d)]).returncode == 0
        planted = {"authorized_keys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHostileKeyOfTheUser user\n",
                   "weed.pid": f"{victim.pid}\n", "sshd.pid": f"{victim.pid}\n", "prometheus.pid": f"{victim.pid}\n"}
        for name, text in planted.items():
            assert hostile.run(["sh", "-c", 'printf %s "$2" > "$1"', "-", str(d / name), text]).returncode == 0
        for cmd in ("start", "stop"):
            res = subprocess.run(["bash", str(REPO / "scripts/services" / f"{service}.sh"), cmd],
                                 env={**os.environ, "D": str(d), "PORT": "2299"}, capture_output=True, text=True,
                                 timeout=120)
            assert res.returncode == 1, (cmd, res.stdout, res.stderr)
            assert res.stderr.count("\n") == 1 and "is not a directory of uid 0" in res.stderr, res.stderr
        # nothing changed: the user's files as they were, root's process alive, nothing listening
        assert sorted(os.listdir(d)) == sorted(planted)
        assert all((d / n).read_text() == t and (d / n).stat().st_uid == hostile.uid for n, t in planted.items())
        assert victim.poll() is None
        assert subprocess.run(["bash", "-c", "echo > /dev/tcp/127.0.0.1/2299"], capture_output=True).returncode != 0
    finally:
        victim.kill()
        victim.wait()
