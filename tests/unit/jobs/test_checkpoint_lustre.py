"""Checkpoints fit for a parallel file system (issue 21, point 10): a save's hash is computed
while writing (no read-back of the shard), every file is fsynced before the pointer moves, the
pointer `.gpuhpc-latest` cannot collide with DeepSpeed's `latest` tag file (an older `latest`
symlink is still read once), the newest N are kept, and what this job's killed saves left behind
(temporaries, uncommitted steps) is removed, never another job's."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec


@pytest.fixture(autouse=True)
def _run_env(monkeypatch):
    monkeypatch.setenv("GPUHPC_JOB_ID", "77")
    monkeypatch.setenv("GPUHPC_RESTART_COUNT", "1")
    monkeypatch.delenv("GPUHPC_LATEST_CHECKPOINT", raising=False)
    monkeypatch.delenv("GPUHPC_KEEP_CHECKPOINTS", raising=False)


def _tree(root):
    (root / "sub").mkdir(parents=True)
    (root / "a.bin").write_bytes(b"a" * 5000)
    (root / "sub" / "b.bin").write_bytes(b"b" * 123)
    (root / "a-c").write_bytes(b"c")                 # sorts between "a.bin" and "sub/" by parts
    os.symlink("a.bin", root / "link-to-a")
    return root


@pytest.mark.parametrize("kind", ["file", "dir", "bytes"])
def test_the_shard_hash_is_computed_while_writing_not_read_back(tmp_path, monkeypatch, kind):
    if kind == "file":
        src = tmp_path / "s.pt"
        src.write_bytes(os.urandom(3 << 20))
    elif kind == "dir":
        src = _tree(tmp_path / "s")
    else:
        src = b"raw shard bytes"
    real = ckpt._sha256
    monkeypatch.setattr(ckpt, "_sha256", lambda p: pytest.fail(f"{p} read back to hash it"))
    sdir = ckpt.save_shard(src, 5, rank=0, world_size=1, directory=tmp_path / "ck", timeout=5)
    monkeypatch.setattr(ckpt, "_sha256", real)
    m = ckpt.read_manifest(sdir)
    shard = sdir / m["shards"][0]["file"]
    assert m["shards"][0]["sha256"] == real(shard) and m["shards"][0]["bytes"] == ckpt._size(shard)
    assert ckpt.is_complete(sdir, verify=True)
    if kind == "dir":
        assert os.readlink(shard / "link-to-a") == "a.bin" and (shard / "sub" / "b.bin").read_bytes() == b"b" * 123


def test_every_file_is_fsynced_before_the_pointer_moves(tmp_path, monkeypatch):
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", str(b)))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ckpt.save_atomic(_tree(tmp_path / "src"), "step-1", directory=tmp_path / "ck")
    moved = events.index(("replace", str(tmp_path / "ck" / ".gpuhpc-latest")))
    synced = {path for what, path in events[:moved] if what == "fsync"}
    final = tmp_path / "ck" / "step-1"
    files = {str(p) for p in (tmp_path / "ck").glob(".gpuhpc-tmp.*")}          # nothing left
    assert not files
    # the files were fsynced under their temporary name, then renamed into step-1
    assert sum(1 for p in synced if p.endswith(("/a.bin", "/sub/b.bin", "/a-c"))) == 3, events
    assert str(tmp_path / "ck") in synced and final.is_dir()


def test_deepspeeds_latest_file_is_neither_the_checkpoint_nor_replaced(tmp_path):
    ck = tmp_path / "ck"
    (ck / "global_step10").mkdir(parents=True)
    (ck / "global_step10" / "mp_rank_00_model_states.pt").write_bytes(b"w")
    (ck / "latest").write_text("global_step10")                      # DeepSpeed's tag file
    assert ckpt.latest_checkpoint(ck) == ck / "global_step10"
    ckpt.save_atomic(b"x", "extra.bin", directory=ck)
    assert (ck / "latest").read_text() == "global_step10" and not (ck / "latest").is_symlink()
    assert os.readlink(ck / ".gpuhpc-latest") == "extra.bin"


def test_an_older_latest_symlink_is_read_once_then_replaced(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "old.bin").write_bytes(b"o")
    (ck / "newer-but-unpointed.bin").write_bytes(b"n")
    os.symlink("old.bin", ck / "latest")                             # written by gpuhpc before 2026-12
    assert ckpt.latest_checkpoint(ck) == ck / "old.bin"
    ckpt.save_atomic(b"1", "new.bin", directory=ck)
    assert not os.path.lexists(ck / "latest") and ckpt.latest_checkpoint(ck) == ck / "new.bin"


def test_keep_the_newest_n_of_what_gpuhpc_saved(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.yaml").write_text("mine")                          # not saved by gpuhpc: never removed
    for i in range(5):
        ckpt.save_atomic(f"{i}".encode(), f"c{i}.bin", directory=ck, keep=2)
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith(".")) == ["c3.bin", "c4.bin", "config.yaml"]
    monkeypatch.setenv("GPUHPC_KEEP_CHECKPOINTS", "0")                # 0 keeps all
    for i in range(5, 8):
        ckpt.save_atomic(f"{i}".encode(), f"c{i}.bin", directory=ck)
    assert len(list(ck.glob("c*.bin"))) == 5
    monkeypatch.delenv("GPUHPC_KEEP_CHECKPOINTS")
    ckpt.save_atomic(b"8", "c8.bin", directory=ck)                   # the default, 3
    assert sorted(p.name for p in ck.glob("c*.bin")) == ["c6.bin", "c7.bin", "c8.bin"]
    with pytest.raises(ValueError):
        ckpt.keep_count(-1)


def test_keep_the_newest_n_committed_steps(tmp_path):
    ck = tmp_path / "ck"
    for step in (10, 20, 30, 40):
        ckpt.save_shard(b"s", step, rank=0, world_size=1, directory=ck, timeout=5, keep=2)
    assert sorted(p.name for p in ck.iterdir() if not p.name.startswith(".")) == ["step-00000030", "step-00000040"]
    assert ckpt.latest_checkpoint(ck) == ck / "step-00000040"


def test_the_checkpoint_this_run_resumed_from_is_kept(tmp_path, monkeypatch):
    ck = tmp_path / "ck"
    ckpt.save_shard(b"s", 20, rank=0, world_size=1, directory=ck, timeout=5)
    ckpt.save_atomic(b"p", "plain-1", directory=ck)
    monkeypatch.setenv("GPUHPC_LATEST_CHECKPOINT", str(ck / "step-00000020"))
    for step in (30, 40, 50, 60):
        ckpt.save_shard(b"s", step, rank=0, world_size=1, directory=ck, timeout=5, keep=2)
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-00000020", "step-00000050", "step-00000060"]
    monkeypatch.setenv("GPUHPC_LATEST_CHECKPOINT", str(ck / "plain-1"))
    for i in range(2, 5):
        ckpt.save_atomic(b"p", f"plain-{i}", directory=ck, keep=2)
    assert sorted(p.name for p in ck.glob("plain-*")) == ["plain-1", "plain-3", "plain-4"]
    monkeypatch.delenv("GPUHPC_LATEST_CHECKPOINT")                    # the next run: it goes
    ckpt.save_atomic(b"p", "plain-5", directory=ck, keep=2)
    assert sorted(p.name for p in ck.glob("plain-*")) == ["plain-4", "plain-5"]


def _leftovers(ck, job: str, run: int):
    """What a killed save of job/run leaves: temporaries and an uncommitted step."""
    tag = f".gpuhpc-tmp.{job}.{run}.node1.4242."
    (ck / f"{tag}c1.bin").write_bytes(b"partial")
    (ck / f"{tag}old-step").mkdir()
    step = ck / ckpt.step_dir_name(int(job) * 10 + run)
    step.mkdir()
    (step / ".sharded").write_text(f"{job}\n")
    (step / "rank-00001.bin").write_bytes(b"half")
    (step / f"{tag}rank-00000.bin").write_bytes(b"p")
    return [ck / f"{tag}c1.bin", ck / f"{tag}old-step", step]


def test_clean_removes_only_this_jobs_leftovers(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    ours = _leftovers(ck, "77", 0)
    theirs = _leftovers(ck, "78", 0)
    committed = ck / "step-00000001"
    ckpt.save_shard(b"s", 1, rank=0, world_size=1, directory=ck, timeout=5, keep=0)
    stray = committed / ".gpuhpc-tmp.77.1.node1.1.x"                    # this run's, in a committed step
    stray.write_bytes(b"")
    ckpt.clean(ck)                                                      # the job script, at a start
    assert not any(os.path.lexists(p) for p in ours) and not stray.exists()
    assert all(os.path.lexists(p) for p in theirs)
    assert ckpt.is_complete(committed)


def test_after_a_save_this_runs_temporaries_stay(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    earlier = _leftovers(ck, "77", 0)
    current = ck / ".gpuhpc-tmp.77.1.node2.99.shard-in-progress"
    current.write_bytes(b"")
    later = ck / ckpt.step_dir_name(2000)                             # may be in progress: stays
    later.mkdir()
    (later / ".sharded").write_text("77\n")
    ckpt.save_shard(b"s", 1000, rank=0, world_size=1, directory=ck, timeout=5)
    assert not any(os.path.lexists(p) for p in earlier) and current.exists() and later.exists()


def test_the_job_script_cleans_before_the_program_and_reads_the_new_pointer(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    ours = _leftovers(ck, "77", 0)
    theirs = _leftovers(ck, "78", 0)
    (ck / "global_step9").mkdir()
    (ck / "latest").write_text("global_step9")                        # DeepSpeed's tag file
    ckpt.save_atomic(b"done", "good.bin", directory=ck)
    (ck / "global_step9").touch()                                       # newer than good.bin
    out = tmp_path / "seen"
    spec = JobSpec(command=("bash", "-c", f'echo "$GPUHPC_LATEST_CHECKPOINT" > {out}'), checkpoint_dir=str(ck))
    (tmp_path / "job.sh").write_text(render(spec))
    env = dict(os.environ, SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1", GPUHPC_SCRATCH_ROOT=str(tmp_path / "s"),
               GPUHPC_PYTHON=sys.executable)
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert out.read_text().strip() == str(ck / "good.bin")
    assert not any(os.path.lexists(p) for p in ours) and all(os.path.lexists(p) for p in theirs)
    assert "left by an earlier run of this job" in res.stderr
