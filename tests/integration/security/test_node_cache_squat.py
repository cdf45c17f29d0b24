"""Issue 39: another user cannot deny a user their node cache by taking its name first. The
throwaway user makes the victim's per-user cache directory (or a symlink of that name to a
directory of its own) in a sticky, world-writable parent (as /tmp, the site's S3 cache root and
the node image cache are); the victim (root here: the same code path as any uid) then stages data
with ``gpuhpc stage pull --cache`` and imports an image with the node image cache's ``ensure``
(real S3, real registry, real enroot). Both succeed from a private directory beside the taken name,
say so in one line naming the taken path and the fix, and put nothing in the planted directory."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from gpuhpc.staging.s3 import S3Stager, S3Url

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/s3.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


@pytest.fixture()
def sticky():
    """A parent like /tmp: root's, mode 1777."""
    parent = Path(tempfile.mkdtemp(prefix="gpuhpc-sec-cache-", dir="/var/tmp"))
    parent.chmod(0o1777)
    yield parent
    subprocess.run(["rm", "-rf", str(parent)], timeout=60)


def _plant(hostile, planted: Path, attack: str) -> Path:
    """The hostile user's directory at ``planted`` (or a symlink there to one of its own): where
    the victim's files would land if it were used."""
    bait = planted if attack == "dir" else hostile.workdir / f"bait-{uuid.uuid4().hex[:6]}"
    assert hostile.run(["mkdir", "-m", "777", str(bait)]).returncode == 0
    if attack == "symlink":
        assert hostile.run(["ln", "-s", str(bait), str(planted)]).returncode == 0
    return bait


@pytest.mark.parametrize("var, attack", [("GPUHPC_SCRATCH_ROOT", "dir"), ("GPUHPC_NODE_CACHE_ROOT", "symlink")])
def test_a_staging_cache_another_user_made_is_never_used(hostile, s3_env, sticky, var, attack):
    bucket = f"gpuhpc-test-{uuid.uuid4().hex[:10]}"
    stager = S3Stager.from_env(s3_env)
    stager.ensure_bucket(bucket)
    (sticky / "d.txt").write_text("data")
    stager.push(sticky / "d.txt", S3Url.parse(f"s3://{bucket}/ds/"))
    (sticky / "d.txt").unlink()
    planted = sticky / (f"gpuhpc-cache-{os.geteuid()}" if var == "GPUHPC_SCRATCH_ROOT" else str(os.geteuid()))
    bait = _plant(hostile, planted, attack)
    env = {k: v for k, v in os.environ.items() if k not in ("GPUHPC_SCRATCH_ROOT", "GPUHPC_NODE_CACHE_ROOT")}
    env.update(s3_env)
    env[var] = str(sticky)
    paths = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "-m", "gpuhpc", "stage", "pull", "--cache", f"s3://{bucket}/ds/"],
                             env=env, capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        notes = [line for line in res.stderr.splitlines() if str(planted) in line]
        assert len(notes) == 1 and "have root remove" in notes[0], res.stderr
        paths.append(Path(res.stdout.strip()))
    assert paths[0] == paths[1] and (paths[0] / "d.txt").read_text() == "data"     # reused by the next job
    private = paths[0].parents[1]
    assert private.parent == sticky and private.name.startswith(planted.name + ".") and not private.is_symlink()
    assert private.stat().st_uid == os.geteuid() and private.stat().st_mode & 0o777 == 0o700
    assert os.listdir(bait) == []


def test_an_image_cache_another_user_made_is_never_used(hostile, sticky, tmp_path):
    started = subprocess.run(["bash", str(REPO / "scripts/services/registry.sh"), "start"], capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    image = started.stdout.strip().splitlines()[-1]             # 127.0.0.1:PORT#gpuhpc/test@sha256:…
    site = tmp_path / "site.toml"
    site.write_text(f'[containers]\nnode_cache_dir = "{sticky}"\n')
    planted = sticky / str(os.geteuid())
    bait = _plant(hostile, planted, "dir")
    env = {**os.environ, "GPUHPC_SITE_CONFIG": str(site), "ENROOT_ALLOW_HTTP": "yes"}
    res = subprocess.run([sys.executable, "-m", "gpuhpc.containers.cache", "ensure", "--here", image], env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    squashfs = Path(res.stdout.strip())
    assert squashfs.is_file() and squashfs.parent.parent == sticky and squashfs.parent.name.startswith(f"{planted.name}.")
    assert squashfs.parent.stat().st_mode & 0o777 == 0o700 and not squashfs.parent.is_symlink()
    notes = [line for line in res.stderr.splitlines() if f"not using node cache {planted}" in line]
    assert len(notes) == 1 and "have root remove" in notes[0], res.stderr
    assert os.listdir(bait) == []
