"""Jobs in images on the shared local cluster (issue 23's acceptance), where `scripts/cluster.sh up`
with a source mirror (GPUHPC_VENDOR_DIR) installed enroot and pyxis and runs each node's slurmd in a
mount namespace of its own (docs/containers.md, "The local cluster"): the local registry's image
(scripts/services/registry.sh) pinned by digest, ``gpuhpc submit --image …@sha256:… -- cat
/etc/os-release`` prints the image's OS; an ordinary user's file written to a mount belongs to that
user; an NGC-style image on a GPU node asks the nvidia-container-cli stand-in (on slurmd's PATH) for
exactly the job's GPUs, by UUID; a two-node step in an image gets a container on each node; a plain ``srun
--container-image`` or ``sbatch --container-image`` of an ordinary user meets the site's image policy
in pyxis' importer (the role's ``gpuhpc_containers_importer_python``). Skipped, saying why, on a local
cluster without containers where no mirror was given; with a mirror, missing containers fail."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyxis_cluster import mpi_image, registry_image, shuffled_nvml

from polling import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # tests/integration: the security suite's user
from security.conftest import hostile  # noqa: E402,F401  (the throwaway ordinary user with a Slurm association)

PYXIS = Path("/etc/slurm/plugstack.conf.d/pyxis.conf")
ENROOT = Path("/usr/local/bin/enroot")
# the enroot/pyxis source mirror: given (scripts/test.sh exports it, ../shared/vendor when none is
# set), `scripts/cluster.sh up` installed containers on the local cluster
MIRROR = os.environ.get("GPUHPC_VENDOR_DIR", "")
MISSING = [str(p) for p in (PYXIS, ENROOT) if not p.exists()]

# (a skip mark, decided before any fixture: no throwaway user made for nothing) only where no
# mirror was given, so no install was asked for
pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not MIRROR and bool(MISSING),
    reason=f"the local cluster has no containers ({', '.join(MISSING)} missing) and no source mirror was given: "
           "`GPUHPC_VENDOR_DIR=<enroot/pyxis source mirror> scripts/cluster.sh up` installs them")]


@pytest.fixture(scope="session", autouse=True)
def containers_installed() -> None:
    """With a mirror given, a missing enroot or pyxis is a failed install: every test here fails
    (before any other fixture: autouse), none is skipped."""
    assert not MISSING, (f"GPUHPC_VENDOR_DIR={MIRROR} was given, so `scripts/cluster.sh up` should have "
                         f"installed containers, yet {', '.join(MISSING)} missing")


def _env(**extra: str) -> dict[str, str]:
    """This environment for the local cluster (its slurm.conf is /etc/slurm's)."""
    return {**{k: v for k, v in os.environ.items() if k != "SLURM_CONF"}, **extra}


def test_gpuhpc_submit_runs_a_command_in_the_image_pinned_by_digest(tmp_path):
    image = registry_image()
    assert "@sha256:" in image
    env = _env()
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--partition", "cpu", "--time", "2m", "--json",
                          "--name", "gpuhpc-test-local-image", "--image", image, "--", "cat", "/etc/os-release"],
                         env={**env, "GPUHPC_LEDGER": "off", "GPUHPC_DATA_DIR": str(tmp_path / "data")},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    log = Path(job["log"])
    wait_for(lambda: not subprocess.run(["squeue", "-h", "-j", str(job["job_id"]), "-o", "%i"], capture_output=True,
                                        text=True, env=env).stdout.strip(), 120, f"job {job['job_id']} to end")
    text = log.read_text() if log.exists() else f"{log} missing"
    assert 'PRETTY_NAME="gpuhpc test image 1 (busybox)"' in text, text


def test_an_ordinary_users_file_in_a_mount_belongs_to_that_user(hostile):
    image = registry_image()
    out = hostile.workdir / "out"
    assert hostile.run(["mkdir", "-p", str(out)]).returncode == 0
    res = hostile.run(["srun", "--partition=cpu", "--time=2", f"--container-image={image}",
                       f"--container-mounts={out}:/out", "sh", "-c", "id -u; touch /out/written"], timeout=180)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[0] == str(hostile.uid), res.stdout      # the user's uid inside, not root
    assert (out / "written").stat().st_uid == hostile.uid


def test_an_ngc_style_image_asks_nvidia_container_cli_for_exactly_the_jobs_gpus_by_uuid(tmp_path):
    """The image sets NVIDIA_VISIBLE_DEVICES=all: enroot's 98-nvidia hook, after the role's
    90-gpuhpc-slurm-gpus.sh, asks the stand-in for the step's GPUs on that node (SLURM_STEP_GPUS),
    not every GPU of the node, by UUID: NVML here enumerates the node's device minors in reverse
    (7..0), so Slurm's GPU N (gpu-nodeX-nvidiaN, minor N) is NVML's 7-N, and only the UUIDs name
    the right ones (the role's importer maps them: python -I, the job's GPUHPC_NVML_MODULE file)."""
    image = registry_image("ngc")
    log = tmp_path / "nvidia-container-cli.log"
    tmp_path.chmod(0o755)
    res = subprocess.run(["srun", "--partition=gpu", "--time=2", "--gres=gpu:h100:2", f"--container-image={image}",
                          "sh", "-c", 'echo "step=$SLURM_STEP_GPUS inside=$NVIDIA_VISIBLE_DEVICES"'],
                         env=_env(GPUHPC_NVCLI_LOG=str(log), **shuffled_nvml(tmp_path, list(range(7, -1, -1)))),
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    line = next((x for x in res.stdout.splitlines() if x.startswith("step=")), "")
    step, inside = (kv.split("=", 1)[1] for kv in line.split())
    want = ",".join(f"GPU-minor-{i}" for i in step.split(","))
    assert len(step.split(",")) == 2 and inside == want, res.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and "configure" in calls[0].split(), calls
    assert f"--device={want}" in calls[0].split() and "--compute" in calls[0].split(), calls


def test_a_two_node_step_in_an_image_gets_a_container_on_each_node():
    """Both nodes run slurmd on this one host: without a mount namespace each, their named
    containers (pyxis' runtime and enroot's data directories) would be one and the same."""
    image = registry_image()
    res = subprocess.run(["srun", "--partition=gpu", "--time=2", "--nodes=2", "--gres=gpu:h100:1",
                          f"--container-image={image}", "--container-name=two-nodes", "sh", "-c",
                          'echo "node $(hostname) $(grep ^ID= /etc/os-release)"'],
                         env=_env(), capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr
    assert sorted(x for x in res.stdout.splitlines() if x.startswith("node ")) == \
        ["node gpu-node1 ID=gpuhpc-test", "node gpu-node2 ID=gpuhpc-test"], res.stdout


def test_an_mpi_program_in_an_image_runs_its_ranks_over_pmix_on_two_nodes():
    """Issue 39.6: Open MPI's ranks in an image, started by srun over PMIx (no mpirun), two per node
    on two nodes: every rank knows the world of 4 and an MPI_Allreduce across the nodes adds up.
    enroot's 50-slurm-pmi hook brings the PMIx server's directories into each container; where
    slurm.conf names them with %n (the local cluster: one slurmd per node on one host), the role's
    51-gpuhpc-pmix-nodename hook expands it (without it, every rank fails to start)."""
    image = mpi_image()
    res = subprocess.run(["srun", "--mpi=pmix", "--partition=gpu", "--time=3", "--nodes=2", "--ntasks-per-node=2",
                          "--gres=gpu:h100:1", f"--container-image={image}", "mpi_hello"],
                         env=_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = sorted(x for x in res.stdout.splitlines() if x.startswith("rank "))
    assert lines == ["rank 0 of 4 on gpu-node1 sum 6", "rank 1 of 4 on gpu-node1 sum 6",
                     "rank 2 of 4 on gpu-node2 sum 6", "rank 3 of 4 on gpu-node2 sum 6"], res.stdout + res.stderr


def test_a_plain_srun_is_held_to_the_site_policy_by_pyxis_importer(hostile):
    """Issue 23: pyxis runs the role's importer (gpuhpc.containers.importer) as the job's user before
    any container exists. With a policy that allows only the local registry and requires pins on
    ``cpu`` (the job's GPUHPC_SITE_CONFIG, which may add rules to /etc/gpuhpc/config.toml's, never
    lift them: this shared cluster's own config has none), an image from another registry and a tag
    are refused with the reason in the step's output; the pinned image runs."""
    image = registry_image()
    registry, digest = image.split("#")[0], image.split("@")[1]
    site = hostile.workdir / "site.toml"
    site.write_text(f'[containers]\nallowed_registries = ["{registry}"]\nrequire_digest_partitions = ["cpu"]\n')

    def srun(ref: str) -> subprocess.CompletedProcess:
        return hostile.run(["srun", "--partition=cpu", "--time=1", f"--container-image={ref}", "grep", "^ID=",
                            "/etc/os-release"], env={"GPUHPC_SITE_CONFIG": str(site)}, timeout=120)

    refused = srun(f"quay.io#gpuhpc/test@{digest}")
    assert refused.returncode != 0, refused.stdout
    assert "image refused or not imported: --container-image: registry quay.io is not allowed" in refused.stderr, \
        refused.stderr
    refused = srun(image.split("@")[0] + ":1")
    assert refused.returncode != 0, refused.stdout
    assert "partition cpu runs only images pinned by digest" in refused.stderr, refused.stderr
    ran = srun(image)
    assert ran.returncode == 0 and ran.stdout.strip() == "ID=gpuhpc-test", ran.stderr


def test_a_plain_sbatch_is_held_to_the_site_policy_by_pyxis_importer(hostile):
    """The same binding point holds a plain ``sbatch --container-image`` of an ordinary user: pyxis
    imports the batch step's image through the importer before the script starts, so a refused image
    runs nothing (the job FAILED, the reason in its output file) and the pinned one runs the script
    in the image. The three jobs are submitted at once and polled until slurmctld has ended each."""
    image = registry_image()
    registry, digest = image.split("#")[0], image.split("@")[1]
    site = hostile.workdir / "site-sbatch.toml"
    site.write_text(f'[containers]\nallowed_registries = ["{registry}"]\nrequire_digest_partitions = ["cpu"]\n')
    refs = {"registry": f"quay.io#gpuhpc/test@{digest}", "tag": image.split("@")[0] + ":1", "pinned": image}
    jobs = {}
    for name, ref in refs.items():
        res = hostile.run(["sbatch", "--parsable", "--partition=cpu", "--time=1", f"--container-image={ref}",
                           f"--output={hostile.workdir / name}.out", "--wrap", "grep ^ID= /etc/os-release"],
                          env={"GPUHPC_SITE_CONFIG": str(site)})
        assert res.returncode == 0, res.stderr
        jobs[name] = res.stdout.strip().split(";", 1)[0]
        hostile.jobs.append(jobs[name])

    def state(job: str) -> str | None:
        out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True,
                             env=_env(), timeout=30).stdout
        word = next((f.split("=", 1)[1] for f in out.split() if f.startswith("JobState=")), None)
        return word if word in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None

    ended = wait_for(lambda: (lambda s: s if all(s.values()) else None)({n: state(j) for n, j in jobs.items()}),
                     180, "the three sbatch jobs ended")
    assert ended == {"registry": "FAILED", "tag": "FAILED", "pinned": "COMPLETED"}, ended
    out = {n: (hostile.workdir / f"{n}.out").read_text() for n in jobs}
    assert "registry quay.io is not allowed" in out["registry"] and "ID=" not in out["registry"], out["registry"]
    assert "partition cpu runs only images pinned by digest" in out["tag"] and "ID=" not in out["tag"], out["tag"]
    assert out["pinned"].strip().splitlines()[-1] == "ID=gpuhpc-test", out["pinned"]
