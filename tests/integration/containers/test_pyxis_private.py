"""A job in an image on a real Slurm with pyxis and enroot (issue 23's first acceptance point, on a
private controller, pyxis_cluster.py): the local registry's image (scripts/services/registry.sh)
pinned by digest; ``srun --container-image=…@sha256:…`` and ``gpuhpc submit --image …@sha256:…``
both print the image's /etc/os-release, and a file written to a mount is there."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyxis_cluster import logs, pyxis_cluster, registry_image

from polling import wait_for


@pytest.fixture
def cluster():
    with pyxis_cluster() as c:
        yield c


def test_a_job_runs_in_the_pinned_image(cluster, tmp_path):
    client, env, base = cluster
    image = registry_image()
    assert "@sha256:" in image

    res = subprocess.run(["srun", "--partition=pyx", "--time=5", f"--container-image={image}", "cat", "/etc/os-release"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"{res.stderr}\n{logs(base)}"
    assert "ID=gpuhpc-test" in res.stdout

    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--partition", "pyx", "--time", "5m", "--name", "gpuhpc-test-pyxis",
                          "--json", "--image", image, "--mount", f"{out}:/out", "--",
                          "sh", "-c", "cat /etc/os-release; cat /etc/os-release > /out/os-release"],
                         env={**env, "GPUHPC_LEDGER": "off", "GPUHPC_DATA_DIR": str(tmp_path / "data")},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    wait_for(lambda: not client.run(["squeue", "-h", "-j", job["job_id"], "-o", "%i"], check=False).stdout.strip(),
             120, f"job {job['job_id']} to end\n{logs(base)}")
    assert Path(job["log"]).exists(), f"{job['log']} missing\n{logs(base)}"
    log = Path(job["log"]).read_text()
    assert 'PRETTY_NAME="gpuhpc test image 1 (busybox)"' in log, log
    assert (out / "os-release").read_text().startswith('NAME="gpuhpc test image"')
