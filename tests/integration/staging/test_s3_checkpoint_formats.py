"""The S3 checkpoint uploader (gpuhpc.staging.job.Uploader, what ``checkpoint: s3://...`` runs
beside a job) uploads only checkpoints their framework finished (issue 32.8): a Trainer
``checkpoint-N/`` without ``trainer_state.json``, a torch DCP directory without ``.metadata``,
a DeepSpeed tag that ``latest`` does not name yet, a directory not yet ``gpuhpc.commit``-ed
among committed ones, are skipped (never a directory still being written), and uploaded once
their save completes. Layouts as each framework writes them (tests/unit/jobs/test_ckpt_formats.py
says from where). Against the real S3 server (SeaweedFS) only: isolated."""
from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from gpuhpc.jobs import checkpoint as ckpt
from gpuhpc.staging import job as sjob
from gpuhpc.staging.s3 import S3Stager, S3Url

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/s3.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


def _files(d: Path, names: tuple[str, ...]) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for n in names:
        (d / n).write_bytes(os.urandom(256))


def _trainer(ck: Path) -> tuple[str, str, callable]:
    names = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")
    _files(ck / "checkpoint-10", names)
    (ck / "checkpoint-10" / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    _files(ck / "checkpoint-20", names)                                    # trainer_state.json not yet
    return "checkpoint-10", "checkpoint-20", lambda: (ck / "checkpoint-20" / "trainer_state.json").write_text("{}")


def _dcp(ck: Path) -> tuple[str, str, callable]:
    _files(ck / "step-10", ("__0_0.distcp", "__1_0.distcp", ".metadata"))
    _files(ck / "step-20", ("__0_0.distcp", "__1_0.distcp", ".metadata.tmp"))
    return "step-10", "step-20", lambda: os.replace(ck / "step-20" / ".metadata.tmp", ck / "step-20" / ".metadata")


def _deepspeed(ck: Path) -> tuple[str, str, callable]:
    names = ("mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt")
    _files(ck / "global_step10", names)
    (ck / "zero_to_fp32.py").write_text("# DeepSpeed's recovery script\n")
    (ck / "latest").write_text("global_step10")
    _files(ck / "global_step20", names)                                    # `latest` not moved yet
    return "global_step10", "global_step20", lambda: (ck / "latest").write_text("global_step20")


def _committed(ck: Path) -> tuple[str, str, callable]:
    _files(ck / "run-a", ("weights.npz",))
    ckpt.commit(ck / "run-a")
    _files(ck / "run-b", ("weights.npz",))                                 # being written: not committed
    return "run-a", "run-b", lambda: ckpt.commit(ck / "run-b")


@pytest.mark.parametrize("layout", [_trainer, _dcp, _deepspeed, _committed], ids=lambda f: f.__name__[1:])
def test_the_uploader_skips_a_checkpoint_still_being_written(s3_env, tmp_path, layout):
    stager = S3Stager.from_env(s3_env)
    bucket = f"gpuhpc-test-{uuid.uuid4().hex[:10]}"
    stager.ensure_bucket(bucket)
    url = S3Url.parse(f"s3://{bucket}/run/")
    ck = tmp_path / "ck"
    ck.mkdir()
    done, writing, finish = layout(ck)
    up = sjob.Uploader(stager, url, ck)

    def uploaded() -> list[str]:
        return sorted(m["name"] for m in sjob.complete_checkpoints(stager, url))

    up.sync()
    assert uploaded() == [done]
    assert not any(o.key.startswith(f"run/{writing}/") for o in stager.list(url))   # not a byte of it
    finish()
    up.sync()
    assert uploaded() == sorted([done, writing])
    assert sjob.restore_checkpoint(stager, url, tmp_path / "node2").name == writing
