"""S3 in the job spec, end to end on the real cluster and the real S3 server: inputs pulled
into the node cache (the second job reuses them without a GET), a damaged cache entry fetched
again, concurrent fetches download once, checkpoints synced to S3 and restored on the other
GPU node after a preemption, an upload cut off before its manifest never restored, and the
credentials in no script, log or database."""
from __future__ import annotations

import hashlib
import multiprocessing
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gpuhpc.jobs.script_mode import submit_spec, with_staging
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.staging import job as sjob
from gpuhpc.staging.cache import NodeCache
from gpuhpc.staging.s3 import MB, S3Stager, S3Url
from gpuhpc.transport.local import LocalRunner
from polling import wait_for

REPO = Path(__file__).resolve().parents[3]
# three 8 MB parts: the job's pull is a multipart download (>= 2 GETs); bench/remote.py times 200 MB
DATASET_MB = int(os.environ.get("GPUHPC_TEST_DATASET_MB", "24"))


@pytest.fixture(scope="module")
def s3_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/s3.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


@pytest.fixture
def env(s3_env, tmp_path, monkeypatch):
    for k, v in {**s3_env, "GPUHPC_SCRATCH_ROOT": str(tmp_path / "scratch"), "GPUHPC_LEDGER": "off",
                 "GPUHPC_DATA_DIR": str(tmp_path / "data"), "GPUHPC_LOG_DIR": str(tmp_path / "logs")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("GPUHPC_NODE_CACHE_ROOT", raising=False)
    (tmp_path / "scratch").mkdir()
    return s3_env


@pytest.fixture
def bucket(env) -> str:
    name = f"gpuhpc-test-{uuid.uuid4().hex[:10]}"
    S3Stager.from_env().ensure_bucket(name)
    return name


@pytest.fixture
def slurm():
    client = SlurmClient(LocalRunner())
    ids: list[str] = []
    yield client, ids
    for j in ids:
        client.cancel(j)


# the checkpoint test's private controller (tests/private_slurm.py): two GPU nodes as the local
# cluster's, its gpu/gpu-hi partitions and preemption; its own ports
CTLD_PORT, SLURMD_PORT, NODE_PORT = 17087, 17088, 17591          # unlike every other private cluster's
GPU_NODES = ["s3ck-node1", "s3ck-node2"]


@pytest.fixture
def private_gpu(monkeypatch):
    """A private GPU-shaped controller; SLURM_CONF points gpuhpc and the jobs at it. Yields (client, ids)
    as ``slurm`` does: the ids are cancelled, then the cluster stopped."""
    from private_slurm import PrivateSlurm, gpu_shape

    shape = gpu_shape(GPU_NODES)
    cluster = PrivateSlurm("gpuhpcs3ck", (CTLD_PORT, SLURMD_PORT, NODE_PORT), shape["nodes"], shape["partitions"],
                           extra={"SlurmdParameters": "config_overrides", "JobRequeue": "1", "KillWait": "5",
                                  "MinJobAge": "600", **shape["extra"]})
    cluster.start(before_start=shape["before_start"])
    try:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster.client, []
    finally:
        cluster.stop()


def _finish(client, job_id, timeout=240) -> str:
    from gpuhpc.jobs.api import Job

    return Job(job_id, client=client).wait(timeout, poll=1).value


def test_inputs_come_from_the_node_cache_and_a_second_job_makes_no_get(env, bucket, slurm, tmp_path, monkeypatch):
    client, ids = slurm
    monkeypatch.delenv("GPUHPC_LEDGER")             # the ledger's database records these jobs
    for argv in (["db", "upgrade"], ["ledger", "account", "add", "research"],
                 ["ledger", "user", "add", "root", "--account", "research", "--default"]):
        res = subprocess.run([sys.executable, "-m", "gpuhpc", *argv], capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, (argv, res.stderr)
    src = tmp_path / "ds"
    src.mkdir()
    blob = os.urandom(DATASET_MB * MB)
    (src / "train.bin").write_bytes(blob)
    (src / "meta.json").write_text('{"n": 1}')
    S3Stager.from_env().push(src, S3Url.parse(f"s3://{bucket}/ds/"))
    digest = hashlib.sha256(blob).hexdigest()
    del blob
    spec = JobSpec(command=("sh", "-c", 'sha256sum "$GPUHPC_SCRATCH/ds/train.bin"'), name="s3-inputs",
                   resources=Resources(partition="cpu", time="10m"),
                   inputs={f"s3://{bucket}/ds/": "$GPUHPC_SCRATCH/ds"}, snapshot=False)
    logs = []
    for _ in range(2):
        job = submit_spec(spec, client=client)
        ids.append(job.job_id)
        assert _finish(client, job.job_id) == "COMPLETED", Path(job._log_path).read_text()
        logs.append(Path(job._log_path).read_text())
    assert digest in logs[0] and digest in logs[1]
    assert "downloaded (" in logs[0]
    gets = int(logs[0].split("downloaded (")[1].split(" GETs")[0])
    assert gets >= 2
    assert "cache hit (0 GETs" in logs[1], logs[1]
    # the credentials are in no script, log or database file
    secret = env["AWS_SECRET_ACCESS_KEY"]
    assert secret not in render(with_staging(spec, LocalRunner()))
    assert all(secret not in text for text in logs)
    db = list((tmp_path / "data").glob("ledger.db*"))
    assert db, "no ledger database"
    for p in (tmp_path / "data").rglob("*"):
        if p.is_file():
            assert secret.encode() not in p.read_bytes(), p


@pytest.mark.isolated          # S3 only (this and the three below): beside the shared cluster
def test_a_damaged_cache_entry_is_fetched_again(env, bucket, tmp_path):
    stager = S3Stager.from_env()
    (tmp_path / "a.bin").write_bytes(os.urandom(3 * MB))
    stager.push(tmp_path / "a.bin", S3Url.parse(f"s3://{bucket}/d/a.bin"))
    cache = NodeCache(stager, tmp_path / "cache")
    url = S3Url.parse(f"s3://{bucket}/d/")
    path, fetched = cache.fetch(url)
    assert fetched and cache.fetch(url) == (path, False)
    gets = stager.gets
    with open(path / "a.bin", "r+b") as fh:             # a flipped byte (same size)
        fh.write(b"\x00\x01")
    path2, fetched = cache.fetch(url)
    assert fetched and stager.gets > gets and "damaged" in cache.notes[-1]
    assert (path2 / "a.bin").read_bytes() == (tmp_path / "a.bin").read_bytes()
    (path2 / "a.bin").unlink()
    assert cache.fetch(url)[1]


def _fetch_in_process(args):
    root, url = args
    stager = S3Stager.from_env()
    _path, fetched = NodeCache(stager, root).fetch(S3Url.parse(url))
    return fetched, stager.gets


@pytest.mark.isolated
def test_jobs_asking_at_once_download_once(env, bucket, tmp_path):
    stager = S3Stager.from_env()
    (tmp_path / "b.bin").write_bytes(os.urandom(8 * MB))
    stager.push(tmp_path / "b.bin", S3Url.parse(f"s3://{bucket}/c/b.bin"))
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        out = pool.map(_fetch_in_process, [(str(tmp_path / "cache"), f"s3://{bucket}/c/")] * 3)
    assert sorted(f for f, _ in out) == [False, False, True]
    assert sum(g for _, g in out) == max(g for _, g in out)     # only one process made GETs


@pytest.mark.isolated
def test_lru_eviction_by_size(env, bucket, tmp_path):
    stager = S3Stager.from_env()
    for name in ("x", "y", "z"):
        (tmp_path / f"{name}.bin").write_bytes(os.urandom(2 * MB))
        stager.push(tmp_path / f"{name}.bin", S3Url.parse(f"s3://{bucket}/{name}/f.bin"))
    cache = NodeCache(stager, tmp_path / "cache", max_bytes=5 * MB)
    px, _ = cache.fetch(S3Url.parse(f"s3://{bucket}/x/"))
    time.sleep(0.01)
    py, _ = cache.fetch(S3Url.parse(f"s3://{bucket}/y/"))
    time.sleep(0.01)
    cache.fetch(S3Url.parse(f"s3://{bucket}/x/"))                  # x used again: y is now the oldest
    time.sleep(0.01)
    pz, _ = cache.fetch(S3Url.parse(f"s3://{bucket}/z/"))
    assert px.exists() and pz.exists() and not py.exists()
    assert any("least recently used" in n for n in cache.notes)


@pytest.mark.isolated
def test_an_upload_cut_off_before_its_manifest_is_never_restored(env, bucket, tmp_path):
    stager = S3Stager.from_env()
    url = S3Url.parse(f"s3://{bucket}/run-cut/")
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "step-5").write_bytes(b"5")
    sjob.upload_checkpoint(stager, ck / "step-5", url)
    (ck / "step-9").write_bytes(b"9")
    stager.push(ck / "step-9", S3Url(url.bucket, url.child("step-9/step-9").key))   # killed before the manifest
    fresh = tmp_path / "node2"
    restored = sjob.restore_checkpoint(stager, url, fresh)
    assert restored == fresh / "step-5" and restored.read_bytes() == b"5"


COUNTER = r'''
import os, sys, time
from gpuhpc.jobs import checkpoint as ck
ck.install_signal_handler()
latest = ck.latest_checkpoint()
start = int(open(latest).read()) if latest else 0
print(f"start {start} on {os.environ.get('SLURMD_NODENAME')}", flush=True)
step = start
while True:
    step += 1
    time.sleep(0.2 if start == 0 else 0.05)     # a resumed run: its 40 steps in 2 s
    if step % 5 == 0 or ck.stop_requested():
        ck.save_atomic(str(step).encode(), name=f"step-{step:06d}")
    if ck.stop_requested():
        print(f"stopped at {step}", flush=True)
        sys.exit(0)
    if step >= start + 40 and start > 0:
        print(f"done at {step}", flush=True)
        sys.exit(0)
'''


@pytest.mark.isolated          # S3 and a private controller of its own: beside the shared cluster
def test_checkpoints_go_to_s3_and_the_job_resumes_on_the_other_gpu_node(env, bucket, private_gpu, tmp_path):
    client, ids = private_gpu
    script = tmp_path / "counter.py"
    script.write_text(COUNTER)
    url = f"s3://{bucket}/run-x/"
    spec = JobSpec(command=(sys.executable, str(script)), name="s3-ckpt",
                   resources=Resources(partition="gpu", gpus=1, gpu_type="h100", time="10m"),
                   checkpoint_dir=str(tmp_path / "local-ckpt" / "%j"), checkpoint=url, grace=20, snapshot=False)
    job = submit_spec(spec, client=client)
    ids.append(job.job_id)
    stager = S3Stager.from_env()
    wait_for(lambda: sjob.complete_checkpoints(stager, S3Url.parse(url)), 120, "a complete checkpoint in S3",
             interval=1)
    first = client.show_job(job.job_id)["NodeList"]
    assert first in GPU_NODES
    other = GPU_NODES[1] if first == GPU_NODES[0] else GPU_NODES[0]
    pre = client.submit_script("#!/bin/bash\nsleep 1\n", extra=[
        "--partition=gpu-hi", f"--nodelist={first}", "--gres=gpu:h100:8", "--time=1",
        "--job-name=gpuhpc-test-preemptor", "--output=/dev/null"])
    ids.append(pre)
    wait_for(lambda: client.restarts(job.job_id) >= 1, 150, f"job {job.job_id} to be requeued by the preemptor",
             interval=1)
    client.update_job(job.job_id, ExcNodeList=first)
    import shutil

    shutil.rmtree(tmp_path / "local-ckpt")              # the other node does not see this node's disk
    assert _finish(client, job.job_id, timeout=300) == "COMPLETED"
    log = Path(job._log_path).read_text()
    events = [ln.split() for ln in log.splitlines() if ln.startswith(("start ", "stopped at"))]
    assert events[0] == ["start", "0", "on", first], log
    # every restart resumes from the step the run before it stopped at (the newest complete
    # checkpoint), the first one on the other node
    resumed = [(int(e[1]), e[3], int(prev[2])) for prev, e in zip(events, events[1:]) if e[0] == "start"]
    assert resumed and all(step == stop for step, _node, stop in resumed), log
    assert resumed[0][1] == other and resumed[0][0] > 0, log
    assert "restored from" in log and "done at" in log
