"""The newest *complete* checkpoint holds for each framework's own save (issue 32.8): a save cut
off before its framework's completion mark is never resumed from.

torch is not installed here, so each directory is laid out as the framework writes it (read in
its own source): torch DCP's FileSystemWriter (``__<rank>_<n>.distcp`` per rank, then
``.metadata.tmp`` renamed to ``.metadata``), DeepSpeed's ``save_checkpoint`` (``<tag>/`` with
``mp_rank_*_model_states.pt`` and ``*zero_pp_rank_*_optim_states.pt``, ``zero_to_fp32.py``
beside it, the tag written into ``latest`` last) and the Trainer's ``_save_checkpoint``
(``checkpoint-<step>/`` with the weights, optimizer, scheduler, RNG state, ``trainer_state.json``
last). A real-torch DCP save (CPU, gloo) is left for a machine with torch."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import gpuhpc
from gpuhpc.jobs import checkpoint as ckpt
from gpuhpc.jobs import ckpt_formats


def _age(path: Path, seconds_ago: int) -> None:
    t = (1_700_000_000 - seconds_ago) * 10**9
    os.utime(path, ns=(t, t), follow_symlinks=False)


# ---------------------------------------------------------------- torch DCP
def _dcp(d: Path, world: int = 2, *, finished: bool = True) -> Path:
    d.mkdir(parents=True)
    for rank in range(world):
        (d / f"__{rank}_0.distcp").write_bytes(b"\x00" * 64)
    if finished:
        (d / ".metadata.tmp").write_bytes(b"pickled metadata")
        os.replace(d / ".metadata.tmp", d / ".metadata")
    else:
        (d / ".metadata.tmp").write_bytes(b"pickled meta")        # the coordinator died mid-finish()
    return d


def test_dcp_complete_only_with_its_metadata(tmp_path):
    ck = tmp_path / "ck"
    done = _dcp(ck / "step-100")
    for f in done.iterdir():
        _age(f, 60)
    cut = _dcp(ck / "step-200", finished=False)
    assert ckpt.is_complete(done) and not ckpt.is_complete(cut)
    assert ckpt.latest_checkpoint(ck) == done
    assert ckpt_formats.classify(cut).kind == "dcp"


def test_dcp_saved_again_over_an_older_save_is_incomplete_until_its_new_metadata(tmp_path):
    d = _dcp(tmp_path / "ck" / "model")
    for f in d.iterdir():
        _age(f, 60)
    assert ckpt.is_complete(d)
    (d / "__0_0.distcp").write_bytes(b"\x01" * 64)                  # a new save in progress
    assert not ckpt.is_complete(d)
    os.replace(_dcp(tmp_path / "x") / ".metadata", d / ".metadata")  # its finish() renames .metadata last
    assert ckpt.is_complete(d)


# ---------------------------------------------------------------- DeepSpeed
def _ds_tag(save_dir: Path, tag: str, *, dp: int = 2, write_latest: bool = True) -> Path:
    d = save_dir / tag
    d.mkdir(parents=True)
    (d / "mp_rank_00_model_states.pt").write_bytes(b"m" * 32)
    for r in range(dp):
        (d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").write_bytes(b"o" * 32)
    (save_dir / "zero_to_fp32.py").write_text("# DeepSpeed's recovery script\n")
    if write_latest:
        (save_dir / "latest").write_text(tag)                         # no newline, as DeepSpeed writes it
    return d


def test_deepspeed_tag_complete_only_when_latest_names_it(tmp_path):
    ck = tmp_path / "ck"
    first = _ds_tag(ck, "global_step10")
    cut = _ds_tag(ck, "global_step20", write_latest=False)           # cut off before `latest`
    assert ckpt.is_complete(first) and not ckpt.is_complete(cut)
    assert not ckpt.is_complete(ck / "zero_to_fp32.py") and not ckpt.is_complete(ck / "latest")
    assert ckpt.latest_checkpoint(ck) == first
    (ck / "latest").write_text("global_step20")
    assert ckpt.latest_checkpoint(ck) == cut and not ckpt.is_complete(first)


def test_a_first_deepspeed_save_cut_off_leaves_nothing_to_resume(tmp_path):
    ck = tmp_path / "ck"
    _ds_tag(ck, "global_step10", write_latest=False)
    assert ckpt.latest_checkpoint(ck) is None


def test_a_deepspeed_save_newer_than_a_restored_checkpoint_wins_over_the_pointer(tmp_path):
    ck = tmp_path / "ck"
    src = _ds_tag(tmp_path / "from-s3", "global_step10")
    restored = ckpt.save_atomic(src, "global_step10", directory=ck)     # what restore_checkpoint does
    _age(ck / ".gpuhpc-latest", 60)
    assert ckpt.latest_checkpoint(ck) == restored.resolve()            # no `latest` file: gpuhpc saved it
    newer = _ds_tag(ck, "global_step20", write_latest=False)
    assert ckpt.latest_checkpoint(ck) == restored.resolve()            # cut off: never resumed from
    (ck / "latest").write_text("global_step20")
    assert ckpt.latest_checkpoint(ck) == newer


# ---------------------------------------------------------------- Hugging Face Trainer
def _hf(output_dir: Path, step: int, *, finished: bool = True) -> Path:
    d = output_dir / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                 "training_args.bin"):
        (d / name).write_bytes(b"x" * 16)
    if finished:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_trainer_checkpoint_complete_only_with_trainer_state(tmp_path):
    out = tmp_path / "ck"
    done = _hf(out, 500)
    _age(done / "trainer_state.json", 60)
    cut = _hf(out, 1000, finished=False)
    (out / "runs" / "Dec03").mkdir(parents=True)                      # TensorBoard logs beside them
    (out / "runs" / "Dec03" / "events.out").write_bytes(b"e")
    (out / "tmp-checkpoint-1500").mkdir()
    (out / "tmp-checkpoint-1500" / "trainer_state.json").write_text("{}")
    assert ckpt.is_complete(done) and not ckpt.is_complete(cut)
    assert not ckpt.is_complete(out / "runs") and not ckpt.is_complete(out / "tmp-checkpoint-1500")
    assert ckpt.latest_checkpoint(out) == done
    (cut / "trainer_state.json").write_text(json.dumps({"global_step": 1000}))
    assert ckpt.latest_checkpoint(out) == cut


# ---------------------------------------------------------------- gpuhpc.commit
def test_commit_marks_a_directory_complete_and_newest(tmp_path):
    ck = tmp_path / "ck"
    mine = ck / "step-7"
    mine.mkdir(parents=True)
    (mine / "weights.npz").write_bytes(b"w")
    assert gpuhpc.commit(mine) == mine
    marker = json.loads((mine / ".gpuhpc-committed").read_text())
    assert set(marker) == {"job", "run", "host", "committed"}
    assert os.readlink(ck / ".gpuhpc-latest") == "step-7"
    later = ck / "step-8"                                              # being written: not committed yet
    later.mkdir()
    (later / "weights.npz").write_bytes(b"half")
    assert ckpt.latest_checkpoint(ck) == mine.resolve()
    assert not ckpt.is_complete(later)                                 # the uploader skips it too
    gpuhpc.commit(later)
    assert ckpt.latest_checkpoint(ck) == later.resolve()
    assert ckpt_formats.classify(later).kind == "committed"


def test_commit_refuses_what_is_not_a_checkpoint_directory(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"x")
    with pytest.raises(ValueError):
        ckpt.commit(tmp_path / "f.bin")
    with pytest.raises(ValueError):
        ckpt.commit(tmp_path / "missing")


def test_commit_step_keeps_its_old_call_form(tmp_path):
    ckpt.save_shard(b"s", 3, rank=0, world_size=1, directory=tmp_path, timeout=5)
    assert ckpt.commit(3, 1, directory=tmp_path, timeout=5) == tmp_path / ckpt.step_dir_name(3)


def test_an_empty_directory_is_never_a_checkpoint(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"a")
    _age(tmp_path / "a.bin", 60)
    (tmp_path / "step-2").mkdir()                                      # just created by a save
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "a.bin"


def test_the_job_script_resumes_from_the_newest_complete_trainer_checkpoint(tmp_path):
    """The job template's $GPUHPC_LATEST_CHECKPOINT follows the same rules (it asks
    latest_checkpoint): a Trainer save cut off at the deadline is newer but not taken."""
    import subprocess
    import sys

    from gpuhpc.jobs.render import render
    from gpuhpc.jobs.spec import JobSpec

    ck = tmp_path / "ck"
    done = _hf(ck, 500)
    for f in [done, *done.iterdir()]:
        _age(f, 60)
    _hf(ck, 1000, finished=False)
    out = tmp_path / "seen"
    spec = JobSpec(command=("bash", "-c", f'echo "$GPUHPC_LATEST_CHECKPOINT" > {out}'), checkpoint_dir=str(ck))
    (tmp_path / "job.sh").write_text(render(spec))
    env = dict(os.environ, SLURM_JOB_ID="77", SLURM_RESTART_COUNT="1", GPUHPC_SCRATCH_ROOT=str(tmp_path / "s"),
               GPUHPC_PYTHON=sys.executable)
    env.pop("GPUHPC_LATEST_CHECKPOINT", None)
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert out.read_text().strip() == str(done)
