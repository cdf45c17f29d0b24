"""Every job on the local cluster gets a private /tmp (job_container/tmpfs + PrologFlags=Contain,
gpuhpc_nvme_scratch's job_container.conf, BasePath on the real disk), removed when the job ends.

Two jobs run at the same time on one node; each writes its own marker to /tmp/x, waits until the
other has written too, and reads /tmp/x back. Each must read its own marker, the host's /tmp must
hold neither, and the per-job directories under BasePath must be gone after the jobs."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from polling import wait_for

pytestmark = pytest.mark.integration

NODE = "cpu-node1"
JOB = r"""#!/bin/bash
echo "$MARK" > /tmp/x
touch "$SHARED/wrote.$SLURM_JOB_ID"
for _ in $(seq 120); do [ "$(ls "$SHARED" | grep -c '^wrote\.')" -ge 2 ] && break; sleep 0.5; done
{ cat /tmp/x; echo "$SLURM_JOB_ID"; } > "$SHARED/read.$MARK"
"""


def _base_path() -> Path:
    conf = Path(os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf")).parent / "job_container.conf"
    for line in conf.read_text().splitlines():
        if line.strip().lower().startswith("basepath="):
            return Path(line.split("=", 1)[1].strip())
    raise AssertionError(f"no BasePath in {conf}")


def test_two_jobs_on_one_node_have_their_own_tmp(tmp_path):
    shared = tmp_path / "shared"          # under /var/tmp (tests/conftest.py), seen by jobs and test
    shared.mkdir()
    script = tmp_path / "job.sh"
    script.write_text(JOB)
    marks = [f"m-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    jobs = []
    try:
        for mark in marks:
            out = subprocess.run(
                ["sbatch", "--parsable", "--partition=cpu", f"--nodelist={NODE}", "--time=2",
                 "--job-name=gpuhpc-private-tmp", f"--output={tmp_path}/%j.out",
                 f"--export=ALL,MARK={mark},SHARED={shared}", str(script)],
                check=True, capture_output=True, text=True).stdout
            jobs.append(out.strip().split(";")[0])
        reads = wait_for(lambda: sorted(shared.glob("read.*")) if len(list(shared.glob("read.*"))) == 2 else None,
                         120, "both jobs to read /tmp/x back")
        seen = {p.name.removeprefix("read."): p.read_text().split() for p in reads}
        for mark, job in zip(marks, jobs):
            assert seen[mark] == [mark, job], (mark, seen, [(tmp_path / f"{j}.out").read_text() for j in jobs])
        host_x = Path("/tmp/x")
        assert not (host_x.is_file() and any(m in host_x.read_text() for m in marks)), "a job wrote the host's /tmp"

        def dirs_gone():
            squeue = subprocess.run(["squeue", "-h", "-j", ",".join(jobs), "-o", "%i"],
                                    capture_output=True, text=True).stdout.split()
            return not squeue and not any((_base_path() / NODE / j).exists() for j in jobs)
        wait_for(dirs_gone, 60, "the jobs' private /tmp directories to be removed")
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)
