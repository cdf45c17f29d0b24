"""A job in an image on a real Slurm with pyxis and enroot (issue 23's first acceptance point, on a
private controller, pyxis_cluster.py): the local registry's image (scripts/services/registry.sh)
pinned by digest; ``srun --container-image=…@sha256:…`` and ``gpuhpc submit --image …@sha256:…``
both print the image's /etc/os-release, and a file written to a mount is there; an NGC-style image
asks the nvidia-container-cli stand-in for exactly the job's GPUs. Marked isolated: nothing here
touches the shared local cluster."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from pyxis_cluster import logs, pyxis_cluster, registry_image

from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]


@pytest.fixture(scope="module")
def cluster():
    with pyxis_cluster() as c:
        yield c


@pytest.fixture
def user():
    """A throwaway Unix user (removed afterwards)."""
    name = f"gpuhpc-ctr-{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name], check=True,
                   capture_output=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)


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


def test_an_ordinary_user_runs_as_itself_and_owns_what_it_writes_to_a_mount(cluster, user):
    client, env, base = cluster
    image = registry_image()
    pw = pwd.getpwnam(user)
    out = Path(tempfile.mkdtemp(prefix="gpuhpc-ctr-out-", dir="/var/tmp"))
    try:
        os.chown(out, pw.pw_uid, pw.pw_gid)
        res = subprocess.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={env['SLURM_CONF']}",
                              f"PATH={env['PATH']}", "srun", "--partition=pyx", "--time=5",
                              f"--container-image={image}", f"--container-mounts={out}:/out",
                              "sh", "-c", "id -u; touch /out/written"], capture_output=True, text=True, timeout=180,
                             cwd="/var/tmp")
        assert res.returncode == 0, f"{res.stderr}\n{logs(base)}"
        assert res.stdout.split()[0] == str(pw.pw_uid)               # the user's uid inside, not root
        assert (out / "written").stat().st_uid == pw.pw_uid
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_an_ngc_style_image_asks_nvidia_container_cli_for_exactly_the_jobs_gpus(cluster, tmp_path):
    """The image sets NVIDIA_VISIBLE_DEVICES=all; the job holds GPUs 1 and 2 (a job on GPU 0
    first): enroot's 98-nvidia hook, after the role's 90-gpuhpc-slurm-gpus.sh, asks the stand-in
    on slurmd's PATH for --device=1,2, not all (nor the first two)."""
    client, env, base = cluster
    image = registry_image("ngc")
    holder = client.run(["sbatch", "--parsable", "--partition=pyx", "--gpus=1", "--time=2", "--wrap", "sleep 120"],
                        check=False)
    assert holder.returncode == 0, holder.stderr
    holder_id = holder.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: client.run(["squeue", "-h", "-j", holder_id, "-o", "%t"], check=False).stdout.strip() == "R",
                 60, "the job on GPU 0 to run")
        log = tmp_path / "nvidia-container-cli.log"
        res = subprocess.run(["srun", "--partition=pyx", "--time=5", "--gpus=2", f"--container-image={image}",
                              "sh", "-c", 'echo "step=$SLURM_STEP_GPUS inside=$NVIDIA_VISIBLE_DEVICES"'],
                             env={**env, "GPUHPC_NVCLI_LOG": str(log)}, capture_output=True, text=True, timeout=180)
    finally:
        client.run(["scancel", holder_id], check=False)
    assert res.returncode == 0, f"{res.stderr}\n{logs(base)}"
    assert "step=1,2 inside=1,2" in res.stdout, res.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and " configure " in f" {calls[0]} ", calls
    assert "--device=1,2" in calls[0].split() and "--compute" in calls[0].split(), calls
