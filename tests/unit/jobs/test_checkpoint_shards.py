"""Sharded checkpoints: every rank's shard, one manifest, `.gpuhpc-latest` moved once, by rank 0;
a save that lost a rank never becomes the latest."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from gpuhpc.jobs import checkpoint as ckpt

CTX = mp.get_context("fork")


@pytest.fixture(autouse=True)
def _run_env(monkeypatch):
    monkeypatch.setenv("GPUHPC_JOB_ID", "77")
    monkeypatch.setenv("GPUHPC_RESTART_COUNT", "0")
    monkeypatch.delenv("GPUHPC_LATEST_CHECKPOINT", raising=False)


def _save(r: int, world: int, directory: str, step: int, timeout: float) -> None:
    ckpt.save_shard(f"shard {r} of step {step}".encode(), step, rank=r, world_size=world,
                    directory=directory, timeout=timeout)


def _save_all(tmp_path, step: int, ranks, world: int = 4, timeout: float = 20) -> list[int]:
    procs = [CTX.Process(target=_save, args=(r, world, str(tmp_path / "ck"), step, timeout)) for r in ranks]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    return [p.exitcode for p in procs]


def test_every_rank_writes_a_shard_and_rank_zero_commits_once(tmp_path):
    assert _save_all(tmp_path, 10, [3, 1, 2, 0]) == [0, 0, 0, 0]
    ck = tmp_path / "ck"
    step = ck / "step-00000010"
    assert os.readlink(ck / ".gpuhpc-latest") == "step-00000010"
    m = json.loads((step / "MANIFEST.json").read_text())
    assert m["world_size"] == 4 and m["step"] == 10 and [s["rank"] for s in m["shards"]] == [0, 1, 2, 3]
    assert {s["file"] for s in m["shards"]} == {f"rank-{r:05d}.bin" for r in range(4)}
    assert ckpt.is_complete(step, verify=True)
    assert ckpt.shard_path(step, rank=2).read_bytes() == b"shard 2 of step 10"
    assert not [p for p in step.iterdir() if p.name.startswith((".tmp-", ".gpuhpc-tmp."))]
    assert ckpt.latest_checkpoint(ck) == step.resolve()


def test_a_rank_killed_during_the_save_leaves_latest_on_the_previous_checkpoint(tmp_path):
    assert _save_all(tmp_path, 10, range(4)) == [0, 0, 0, 0]
    codes = _save_all(tmp_path, 20, [0, 1, 3], timeout=1)       # rank 2 died before its shard
    assert codes[0] != 0 and codes[1:] == [0, 0]                  # rank 0 raised IncompleteCheckpoint
    ck = tmp_path / "ck"
    assert os.readlink(ck / ".gpuhpc-latest") == "step-00000010"
    assert not (ck / "step-00000020" / "MANIFEST.json").exists()
    assert not ckpt.is_complete(ck / "step-00000020")
    os.unlink(ck / ".gpuhpc-latest")                              # even without the link
    assert ckpt.latest_checkpoint(ck) == ck / "step-00000010"


def test_shards_left_by_an_earlier_run_do_not_complete_a_new_save(tmp_path, monkeypatch):
    assert _save_all(tmp_path, 30, [1, 2, 3], timeout=1)          # run 0: rank 0 killed
    monkeypatch.setenv("GPUHPC_RESTART_COUNT", "1")
    codes = _save_all(tmp_path, 30, [0, 1], timeout=1)            # run 1: only ranks 0 and 1
    assert codes[0] != 0
    assert not ckpt.is_complete(tmp_path / "ck" / "step-00000030")
    assert _save_all(tmp_path, 30, range(4)) == [0, 0, 0, 0]      # run 1, all ranks
    assert ckpt.is_complete(tmp_path / "ck" / "step-00000030", verify=True)


def test_a_committed_step_is_not_rewritten(tmp_path):
    assert _save_all(tmp_path, 40, range(2), world=2) == [0, 0]
    before = (tmp_path / "ck" / "step-00000040" / "MANIFEST.json").read_text()
    ckpt.save_shard(b"other", 40, rank=1, world_size=2, directory=tmp_path / "ck")
    assert (tmp_path / "ck" / "step-00000040" / "MANIFEST.json").read_text() == before
    assert (tmp_path / "ck" / "step-00000040" / "rank-00001.bin").read_bytes() == b"shard 1 of step 40"


def test_a_corrupt_shard_fails_verification(tmp_path):
    assert _save_all(tmp_path, 50, range(2), world=2) == [0, 0]
    step = tmp_path / "ck" / "step-00000050"
    (step / "rank-00001.bin").write_bytes(b"shard 1 of step 5X")
    assert ckpt.is_complete(step) and not ckpt.is_complete(step, verify=True)
    (step / "rank-00001.bin").unlink()
    assert not ckpt.is_complete(step)


def test_directory_and_file_shards_and_the_shell_entry_point(tmp_path, monkeypatch):
    src = tmp_path / "scratch" / "opt"
    src.mkdir(parents=True)
    (src / "a.pt").write_text("a")
    ckpt.save_shard(src, 60, rank=1, world_size=2, directory=tmp_path / "ck")
    f = tmp_path / "scratch" / "model.pt"
    f.write_text("m")
    env = dict(os.environ, GPUHPC_CHECKPOINT_DIR=str(tmp_path / "ck"), RANK="0", WORLD_SIZE="2")
    res = subprocess.run([sys.executable, "-m", "gpuhpc.jobs.checkpoint", "save-shard", str(f), "60"],
                         env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    step = tmp_path / "ck" / "step-00000060"
    assert res.stdout.strip() == str(step)
    assert (step / "rank-00001" / "a.pt").read_text() == "a" and (step / "rank-00000.pt").read_text() == "m"
    assert ckpt.is_complete(step, verify=True)
    res = subprocess.run([sys.executable, "-m", "gpuhpc.jobs.checkpoint", "latest"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.stdout.strip() == str(step.resolve())
