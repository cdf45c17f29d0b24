"""Issue 39 (hostile user): pyxis' importer (gpuhpc.containers.importer, the role's
``gpuhpc-pyxis-importer``) imported an image that is not in the node cache into
``$TMPDIR/gpuhpc-import-UID-JOB.STEP.sqsh``: a name anyone can predict (job ids are sequential) in a
directory others may write. A throwaway user who made that name first (here a symlink into the
victim's home) stopped the victim's container step (the victim cannot remove another's entry of a
sticky directory) and, without the kernel's protected_symlinks, had enroot write where the link
pointed. Now each step's import goes to a directory nobody could name before (mkdtemp, 0700).

On the local cluster (cpu-node1's own mount namespace, real Slurm, pyxis, enroot, the local
registry), as two throwaway users: the victim's step in an image, its TMPDIR a shared sticky
directory where the hostile user planted the old name for that very step, runs; the planted link is
untouched, nothing was written where it points, and the step's own import directory is gone after
(pyxis' release). Skipped, saying why, on a local cluster without containers."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from polling import wait_for

from .test_enroot_squat import ENROOT_CONF, NODE, PYXIS, victim  # noqa: F401  (the second throwaway user)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))
from pyxis_cluster import registry_image  # noqa: E402  (the local registry's test image)

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not (PYXIS.exists() and ENROOT_CONF.exists()),
    reason=f"the local cluster has no containers ({PYXIS} or {ENROOT_CONF} missing): "
           "`GPUHPC_VENDOR_DIR=<enroot/pyxis source mirror> scripts/cluster.sh up` installs them")]


@pytest.fixture()
def shared():
    """A directory like /tmp (root's, 1777) that both users may use as TMPDIR."""
    d = Path(tempfile.mkdtemp(prefix="gpuhpc-sec-import-", dir="/var/tmp"))
    d.chmod(0o1777)
    yield d
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], timeout=60)


def _state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%t"], capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


def test_a_planted_import_name_neither_stops_nor_reaches_the_victims_container_step(hostile, victim, shared):
    tag = registry_image().split("@", 1)[0] + ":1"        # a tag: imported for the step, not from the node cache
    job = victim.sbatch("--partition=cpu", f"--nodelist={NODE}", "--time=3", "--wrap", "sleep 170")
    try:
        wait_for(lambda: _state(job) == "R", 120, f"the victim's job {job} to run")
        planted = shared / f"gpuhpc-import-{victim.uid}-{job}.0.sqsh"      # the old name of its first step
        through = Path(victim.home) / "written-through-the-link.sqsh"
        assert hostile.run(["ln", "-s", str(through), str(planted)]).returncode == 0
        res = victim.run(["srun", f"--jobid={job}", "--overlap", "--time=2", f"--container-image={tag}",
                          "grep", "^ID=", "/etc/os-release"], env={"TMPDIR": str(shared)}, timeout=240)
        assert res.returncode == 0, res.stdout + res.stderr
        assert res.stdout.strip().splitlines()[-1] == "ID=gpuhpc-test", res.stdout
        assert planted.is_symlink() and planted.lstat().st_uid == hostile.uid       # the hostile user's, untouched
        assert not through.exists() and not through.is_symlink()                   # nothing written through it
        assert list(shared.iterdir()) == [planted], list(shared.iterdir())          # the step's directory released
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=60)
