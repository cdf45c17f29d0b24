"""Issue 23 in the lab (see conftest.py): gpuhpc.cluster.containers (the gpuhpc_containers role) on the
login and compute hosts, which reach no source host: enroot and pyxis are built from the source-archive
mirror (GPUHPC_VENDOR_DIR, copied onto the lab's shared filesystem, /shared/vendor) with packages from
the image's apt cache (scripts/lab.sh bakes them in), and verify runs the lab registry's test image
(`scripts/lab.sh registry`: 10.213.0.1:5500 on the switch), pinned by digest. A --check run and a
second run change nothing, and `srun --container-image` from the login host runs the image on a compute
host through the lab's slurmd, without restarting it. Skipped without a mirror (the lab cannot download)."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import REPO, SHARED, Lab, recap

pytestmark = pytest.mark.integration

PLAYBOOK = "gpuhpc.cluster.containers"
HOSTS = {"login", "c1", "c2"}                     # slurm_compute:slurm_login
PRETTY = 'PRETTY_NAME="gpuhpc test image 1 (busybox)"'   # scripts/services/registry.sh's image


def _changed_tasks(out: str) -> list[str]:
    """The header of each task that reported changed, with the host's line."""
    task, keep = "", []
    for line in out.splitlines():
        if line.startswith("TASK ["):
            task = line
        elif line.startswith("changed: "):
            keep.append(f"{task} {line}")
    return keep


@pytest.fixture(scope="module")
def containers(lab: Lab) -> dict:
    """The mirror on /shared, the lab's registry, and the containers play's first run."""
    vendor = os.environ.get("GPUHPC_VENDOR_DIR", "")
    if not vendor or not (Path(vendor) / "SHA256SUMS").is_file():
        pytest.skip("no source-archive mirror (GPUHPC_VENDOR_DIR with SHA256SUMS): "
                    "the lab cannot download enroot and pyxis")
    shutil.rmtree(SHARED / "vendor", ignore_errors=True)
    shutil.copytree(vendor, SHARED / "vendor")
    image = lab.timed("containers_registry_s", lab.sh, "registry", timeout=300).stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"10\.213\.0\.1:\d+#gpuhpc/test@sha256:[0-9a-f]{64}", image), image
    first = lab.timed("containers_first_play_s", lab.play, playbook=PLAYBOOK)
    return {"image": image, "first": first}


def test_the_containers_play_builds_enroot_and_pyxis_offline_and_verify_runs_the_pinned_image(lab: Lab,
                                                                                              containers: dict):
    first: subprocess.CompletedProcess = containers["first"]
    assert first.returncode == 0, first.stdout[-6000:]
    rows = recap(first.stdout)
    assert set(rows) == HOSTS and all(r["failed"] == 0 for r in rows.values()), rows
    # verify's container on every host: enroot import of the digest from the lab's registry, create, start
    said = re.findall(r'^ok: \[(\w+)\] => \{\s+"msg": \[\s+"(PRETTY_NAME=.*?)"\s+\]', first.stdout.replace('\\"', '"'),
                      re.MULTILINE)
    assert sorted(said) == sorted((h, PRETTY) for h in HOSTS), said
    # what each host has is this source's build (a reused lab keeps an older one unless the stamp differs),
    # built against the headers of the Slurm it runs (a release's slurmstepd refuses another's pyxis)
    script = (REPO / "ansible/roles/gpuhpc_containers/files/build-containers.sh").read_text()
    pinned = re.findall(r'^  "(\w+) \S+ [0-9a-f]{64} ([0-9a-f]{64}) ', script, re.MULTILINE)
    trees = " ".join(f"{name}:{tree}" for name, tree in pinned)
    assert trees.count(":") == 2, trees
    for host in sorted(HOSTS):
        stamp = lab.ssh(host, "cat /usr/local/share/gpuhpc/containers.stamp")
        got = re.search(r" trees (.+) slurm (\S+) ", stamp)
        assert got and got.group(1) == trees, (host, stamp)
        headers = lab.ssh(host, "dpkg-query -W -f='${Version}' libslurm-dev")
        running = lab.ssh(host, "slurmd -V 2>/dev/null || srun --version").split()[-1]
        assert got.group(2) == headers and headers.split("-")[0] == running, (host, stamp, headers, running)


def test_a_check_run_and_a_second_run_change_nothing(lab: Lab, containers: dict):
    check = lab.timed("containers_check_play_s", lab.play, "--check", "--diff", playbook=PLAYBOOK)
    assert check.returncode == 0, check.stdout[-4000:]
    changed = {h: r["changed"] for h, r in recap(check.stdout).items()}
    assert changed == dict.fromkeys(HOSTS, 0), _changed_tasks(check.stdout)
    again = lab.timed("containers_second_play_s", lab.play, playbook=PLAYBOOK)
    assert again.returncode == 0, again.stdout[-4000:]
    changed = {h: r["changed"] for h, r in recap(again.stdout).items()}
    assert changed == dict.fromkeys(HOSTS, 0), _changed_tasks(again.stdout)
    # verify ran the container again (the image is imported afresh each run, not left behind)
    assert again.stdout.replace('\\"', '"').count(PRETTY) == len(HOSTS)


def test_srun_container_image_from_the_login_host_runs_the_image_on_a_compute_host(lab: Lab, containers: dict):
    # pyxis is loaded by srun on the login host and by the step's slurmstepd on the compute host, both
    # reading plugstack.conf as they start: the slurmd that was running before the play serves it
    image = shlex.quote(f"--container-image={containers['image']}")
    out = lab.timed("containers_srun_s", lab.ssh, "login",
                    f"srun --nodes=1 {image} sh -c 'grep ^PRETTY_NAME= /etc/os-release; hostname'", timeout=180)
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0] == PRETTY and lines[1] in {"c1", "c2"}, out
