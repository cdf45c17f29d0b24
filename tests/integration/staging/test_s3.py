"""Staging against a real S3 server (SeaweedFS, scripts/services/s3.sh): multipart upload,
atomic download, wrong-secret rejection, presigned URLs, the node-local cache and the CLI."""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path

import pytest

from gpuhpc.errors import StagingError
from gpuhpc.staging.cache import NodeCache
from gpuhpc.staging.s3 import MB, S3Stager, S3Url

# the S3 server only, never the shared cluster: runs beside it
pytestmark = [pytest.mark.integration, pytest.mark.isolated]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/s3.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


@pytest.fixture()
def bucket(s3_env) -> str:
    name = f"gpuhpc-test-{uuid.uuid4().hex[:10]}"
    S3Stager.from_env(s3_env).ensure_bucket(name)
    return name


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_push_pull_roundtrip_with_multipart(s3_env, bucket, tmp_path):
    src = tmp_path / "ckpt"
    (src / "shards").mkdir(parents=True)
    (src / "meta.json").write_text('{"step": 42}')
    (src / "shards" / "model-00001.bin").write_bytes(os.urandom(12 * MB))   # > multipart threshold
    stager = S3Stager.from_env(s3_env, multipart_threshold=5 * MB, multipart_chunksize=5 * MB)
    url = S3Url.parse(f"s3://{bucket}/runs/job-1/")
    assert stager.push(src, url) == 2
    dest = tmp_path / "restored"
    assert stager.pull(url, dest) == 2
    assert _tree(dest) == _tree(src)
    assert not list(dest.rglob(".*")), "temp files left behind"
    # the multipart object really was multipart (ETag "<md5>-<parts>")
    assert "-" in stager.head(url.child("shards/model-00001.bin")).etag


def test_one_object_comes_in_ranged_parts_pinned_to_its_etag(s3_env, bucket, tmp_path):
    """A single object: one ranged GET per part (no HEAD), written in place, mode from the umask;
    a GET naming an ETag the object no longer has fails and leaves nothing behind."""
    data = os.urandom(12 * MB + 12345)
    (tmp_path / "w.bin").write_bytes(data)
    stager = S3Stager.from_env(s3_env, multipart_threshold=5 * MB, multipart_chunksize=5 * MB)
    url = S3Url.parse(f"s3://{bucket}/one/w.bin")
    stager.push(tmp_path / "w.bin", url)
    gets = stager.gets
    assert stager.pull(url, tmp_path / "got.bin") == 1
    assert stager.gets - gets == 3                              # 5 + 5 + 2.01 MB
    assert (tmp_path / "got.bin").read_bytes() == data
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "got.bin").stat().st_mode & 0o777 == 0o666 & ~umask
    listed = next(iter(stager.list(url)))
    (tmp_path / "w.bin").write_bytes(os.urandom(MB))
    stager.push(tmp_path / "w.bin", url)                        # replaced after the LIST
    with pytest.raises(StagingError, match="PreconditionFailed"):
        stager._download(bucket, listed, tmp_path / "stale.bin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["got.bin", "w.bin"]
    empty = S3Url.parse(f"s3://{bucket}/one/empty")
    stager.put_bytes(b"", empty)
    assert stager.pull(empty, tmp_path / "empty") == 1 and (tmp_path / "empty").read_bytes() == b""


def test_wrong_secret_is_rejected(s3_env, bucket, tmp_path):
    bad = {**s3_env, "AWS_SECRET_ACCESS_KEY": "wrong-secret"}
    (tmp_path / "f").write_text("x")
    with pytest.raises(StagingError):
        S3Stager.from_env(bad).push(tmp_path / "f", S3Url.parse(f"s3://{bucket}/f"))


def test_latest_and_presigned_url(s3_env, bucket, tmp_path):
    stager = S3Stager.from_env(s3_env)
    for step in (10, 20):
        f = tmp_path / f"step-{step:08d}.json"
        f.write_text(f'{{"step": {step}}}')
        stager.push(f, S3Url.parse(f"s3://{bucket}/ckpt/"))
    newest = stager.latest(S3Url.parse(f"s3://{bucket}/ckpt/"))
    assert newest is not None and newest.key.endswith("step-00000020.json")
    with urllib.request.urlopen(stager.presign(newest, 60), timeout=10) as resp:
        assert resp.read() == b'{"step": 20}'


def test_node_cache_downloads_once_and_refreshes_on_change(s3_env, bucket, tmp_path):
    stager = S3Stager.from_env(s3_env)
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.txt").write_text("v1")
    url = S3Url.parse(f"s3://{bucket}/datasets/toy/")
    stager.push(data, url)
    cache = NodeCache(stager, tmp_path / "cache")
    path1, fetched1 = cache.fetch(url)
    path2, fetched2 = cache.fetch(url)
    assert fetched1 and not fetched2 and path1 == path2
    assert (path1 / "train.txt").read_text() == "v1"
    (data / "train.txt").write_text("v2")
    stager.push(data, url)
    path3, fetched3 = cache.fetch(url)
    assert fetched3 and (path3 / "train.txt").read_text() == "v2"


def test_cli_push_pull_and_bad_url(s3_env, bucket, tmp_path):
    env = {**os.environ, **s3_env}
    (tmp_path / "a.txt").write_text("hello")
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuhpc", "stage", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    res = run("push", str(tmp_path / "a.txt"), f"s3://{bucket}/x/")
    assert res.returncode == 0, res.stderr
    res = run("pull", f"s3://{bucket}/x/", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out" / "a.txt").read_text() == "hello"
    res = run("pull", "http://not-s3/x", str(tmp_path / "out2"))
    assert res.returncode == 2 and "URL" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out2").exists()


def test_cli_cache_is_per_user_and_refuses_a_foreign_directory(s3_env, bucket, tmp_path):
    """`stage pull --cache` lands in ${GPUHPC_SCRATCH_ROOT}/gpuhpc-cache-<uid> (mode 0700); a
    directory of that name that others can write is refused with one line naming it (one that
    another user made is not used either: tests/integration/security/test_node_cache_squat.py)."""
    env = {**os.environ, **s3_env, "GPUHPC_SCRATCH_ROOT": str(tmp_path / "scratch")}
    env.pop("GPUHPC_NODE_CACHE_ROOT", None)
    (tmp_path / "scratch").mkdir()
    (tmp_path / "d.txt").write_text("data")
    S3Stager.from_env(s3_env).push(tmp_path / "d.txt", S3Url.parse(f"s3://{bucket}/ds/"))
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuhpc", "stage", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    mine = tmp_path / "scratch" / f"gpuhpc-cache-{os.geteuid()}"
    res = run("pull", "--cache", f"s3://{bucket}/ds/")
    assert res.returncode == 0, res.stderr
    assert Path(res.stdout.strip()).is_relative_to(mine) and (Path(res.stdout.strip()) / "d.txt").read_text() == "data"
    assert mine.stat().st_mode & 0o777 == 0o700
    # the user's own directory with a mode that let others plant files in it
    os.chmod(mine, 0o777)
    expect = "0777"
    res = run("pull", "--cache", f"s3://{bucket}/ds/")
    assert res.returncode == 1 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res.stderr
    assert str(mine) in res.stderr and expect in res.stderr
