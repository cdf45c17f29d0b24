"""Issue 39.3: another user cannot plant image layers that run as a victim through enroot's cache.

enroot keeps each user's layers in ``ENROOT_CACHE_PATH`` (``…/enroot/cache/user-UID``: a name anyone
can predict) and trusts a cached layer by its file name. With world-writable parents, a throwaway
user could make the victim's directory first and put a layer there under the name of a layer of the
victim's pinned image. On the local cluster as the gpuhpc_containers role makes it (a cpu node's own
mount namespace, real Slurm, pyxis, enroot, the local registry's image), as two throwaway users:

- the hostile user cannot make the victim's directories (the parents are root's, 0755), in a job
  on the node as anywhere;
- the victim's container job runs, from directories the prolog made (the victim's, 0700);
- a directory left from before (the victim's cache made by the hostile user, mode 0777, holding a
  layer of the victim's image whose ``/etc/os-release`` says HOSTILE) fails the victim's container
  job with the reason naming the directory; nothing of the planted layer runs, and the node is not
  drained (a user's squat must not take the node from everyone).
Skipped, saying why, on a local cluster without containers."""
from __future__ import annotations

import gzip
import io
import json
import os
import pwd
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest

from .conftest import ACCOUNT, Hostile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "containers"))
from pyxis_cluster import registry_image  # noqa: E402  (the local registry's pinned test image)

ENROOT_CONF = Path("/etc/enroot/enroot.conf")
PYXIS = Path("/etc/slurm/plugstack.conf.d/pyxis.conf")
NODE = "cpu-node1"
NODE_NS = Path(f"/var/lib/gpuhpc/nodes/.mntns/{NODE}")     # its slurmd's mount namespace (docs/containers.md)

pytestmark = [pytest.mark.integration, pytest.mark.skipif(
    not (PYXIS.exists() and ENROOT_CONF.exists()),
    reason=f"the local cluster has no containers ({PYXIS} or {ENROOT_CONF} missing): "
           "`GPUHPC_VENDOR_DIR=<enroot/pyxis source mirror> scripts/cluster.sh up` installs them")]


def _root(argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
    """``argv`` as root in the node's mount namespace (where its jobs see enroot's directories)."""
    pre = ["nsenter", f"--mount={NODE_NS}"] if NODE_NS.exists() else []
    res = subprocess.run([*pre, *argv], capture_output=True, text=True, timeout=120)
    if check and res.returncode != 0:
        raise AssertionError(f"{argv}: {res.stderr or res.stdout}")
    return res


def _parents() -> dict[str, str]:
    """enroot.conf's per-user directories' parents: {"ENROOT_CACHE_PATH": "/…/enroot/cache", …}."""
    out = {}
    for line in ENROOT_CONF.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key in ("ENROOT_RUNTIME_PATH", "ENROOT_CACHE_PATH", "ENROOT_DATA_PATH"):
            assert value.endswith("/user-$(id -u)"), line
            out[key] = value.rsplit("/", 1)[0]
    assert len(out) == 3, ENROOT_CONF.read_text()
    return out


@pytest.fixture(scope="module")
def victim():
    """A second throwaway ordinary user with a Slurm association (the hostile fixture's kind)."""
    name = f"gv{uuid.uuid4().hex[:8]}"
    cluster = next((line.split("=", 1)[1].strip() for line in subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True).stdout.splitlines()
        if line.split("=", 1)[0].strip() == "ClusterName"), "")
    on_cluster = [f"cluster={cluster}"] if cluster else []
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name], check=True,
                   capture_output=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"gpuhpc-{name}-", dir="/var/tmp"))
    uid = pwd.getpwnam(name).pw_uid
    for parent in _parents().values():      # an earlier throwaway user's, of the same (reused) uid
        _root(["rm", "-rf", "--one-file-system", f"{parent}/user-{uid}"])
    try:
        shutil.chown(workdir, name, name)
        os.chmod(workdir, 0o700)
        subprocess.run(["sacctmgr", "-i", "add", "user", name, f"account={ACCOUNT}", *on_cluster], check=True,
                       capture_output=True)
        yield Hostile(name, workdir)
    finally:
        subprocess.run(["sacctmgr", "-i", "delete", "user", f"name={name}", *on_cluster], capture_output=True)
        subprocess.run(["userdel", "--remove", name], capture_output=True)
        shutil.rmtree(workdir, ignore_errors=True)
        for parent in _parents().values():
            _root(["rm", "-rf", "--one-file-system", f"{parent}/user-{uid}"], check=False)


def _srun(user: Hostile, image: str | None, *cmd: str) -> subprocess.CompletedProcess:
    opts = [f"--container-image={image}"] if image else []
    return user.run(["srun", "--partition=cpu", f"--nodelist={NODE}", "--time=2", *opts, *cmd], timeout=240)


def _stat(path: str) -> tuple[int, int] | None:
    res = _root(["stat", "-c", "%u %a", "--", path], check=False)
    if res.returncode != 0:
        return None
    uid, mode = res.stdout.split()
    return int(uid), int(mode, 8)


def test_no_user_can_make_another_users_enroot_directories(hostile, victim):
    parents = _parents()
    dirs = [f"{p}/user-{victim.uid}" for p in parents.values()]
    try:
        # in a job on the node (its mount namespace), as an attacker would
        res = _srun(hostile, None, "sh", "-c", 'for d; do mkdir -m 777 "$d" && echo "made $d"; done; exit 0', "sh", *dirs)
        assert res.returncode == 0, res.stderr
        assert "made " not in res.stdout and res.stderr.count("Permission denied") == 3, res.stdout + res.stderr
        for d in dirs:
            st = _stat(d)
            assert st is None or st[0] == victim.uid, (d, st)          # absent, or the prolog's for the victim
        for parent in parents.values():
            assert _stat(parent) == (0, 0o755), parent                  # root's, not world-writable
    finally:
        for d in dirs:                                                  # a squat that got through, if any
            if (st := _stat(d)) is not None and st[0] != victim.uid:
                _root(["rm", "-rf", "--one-file-system", d])


def test_a_users_container_job_runs_from_directories_the_prolog_made_0700(victim):
    image = registry_image()
    res = _srun(victim, image, "cat", "/etc/os-release")
    assert res.returncode == 0, res.stdout + res.stderr
    assert 'PRETTY_NAME="gpuhpc test image 1 (busybox)"' in res.stdout, res.stdout
    for parent in _parents().values():                                 # enroot cannot make them (root's 0755)
        assert _stat(f"{parent}/user-{victim.uid}") == (victim.uid, 0o700), parent


def _planted_layer(image: str) -> tuple[str, bytes]:
    """(the digest of the image's top layer, that layer as enroot caches it, zstd, with an
    /etc/os-release saying HOSTILE appended): what the hostile user would plant."""
    registry, rest = image.split("#", 1)
    repo, digest = rest.split("@", 1)
    req = urllib.request.Request(f"http://{registry}/v2/{repo}/manifests/{digest}",
                                 headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        layer = json.load(resp)["layers"][-1]["digest"]
    with urllib.request.urlopen(f"http://{registry}/v2/{repo}/blobs/{layer}", timeout=60) as resp:
        tar = io.BytesIO(gzip.decompress(resp.read()))
    body = b'PRETTY_NAME="HOSTILE layer"\n'
    with tarfile.open(fileobj=tar, mode="a") as tf:
        info = tarfile.TarInfo("etc/os-release")
        info.size, info.mode = len(body), 0o644
        tf.addfile(info, io.BytesIO(body))
    z = subprocess.run(["zstd", "-q", "-c"], input=tar.getvalue(), capture_output=True, check=True)
    return layer.split(":", 1)[1], z.stdout


def test_a_squatted_cache_directory_fails_the_victims_container_job_naming_it(hostile, victim):
    image = registry_image()
    cache = f"{_parents()['ENROOT_CACHE_PATH']}/user-{victim.uid}"
    digest, planted = _planted_layer(image)
    # a directory left from before the parents were root's: the hostile user's, open to all, with
    # the victim's image's top layer replaced
    _root(["rm", "-rf", "--one-file-system", cache])
    _root(["mkdir", "-m", "777", cache])
    with tempfile.NamedTemporaryFile(dir="/var/tmp", delete=False) as fh:
        fh.write(planted)
    try:
        _root(["install", "-m", "0644", "-o", str(hostile.uid), fh.name, f"{cache}/{digest}"])
    finally:
        os.unlink(fh.name)
    _root(["chown", str(hostile.uid), cache])
    try:
        res = _srun(victim, image, "cat", "/etc/os-release")
        out = res.stdout + res.stderr
        assert res.returncode != 0, out
        assert "HOSTILE" not in res.stdout, out                        # nothing of the planted layer ran
        assert f"enroot directory {cache} (ENROOT_CACHE_PATH) belongs to another user" in out, out
        state = subprocess.run(["sinfo", "-h", "-n", NODE, "-o", "%t"], capture_output=True, text=True).stdout
        assert "drain" not in state and "drng" not in state, state     # the node stays in service
    finally:
        _root(["rm", "-rf", "--one-file-system", cache])
