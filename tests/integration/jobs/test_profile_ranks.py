"""``--profile nsys`` on a 2-node mpi job: every rank runs its own ``nsys profile`` with a
distinct output name (job, restart, rank) and the step window; ``gpuhpc profile JOBID`` lists
the traces. nsys is not installable here: a stand-in ``nsys`` on PATH records its argv and
environment into the trace file the real one would write."""
from __future__ import annotations

import json
import os

import pytest

from cli_helpers import gpuhpc
from polling import wait_for

pytestmark = pytest.mark.integration

STUB = """#!/bin/sh
# stand-in for nsys: write "-o OUT" + ".nsys-rep" with the argv and the step window
out=""
prev=""
for a in "$@"; do
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
printf '%s\\n' "$*" "steps=$GPUHPC_PROFILE_STEPS" > "$out.nsys-rep"
"""


def test_nsys_per_rank_commands_and_profile_listing(tmp_path, slurm, track):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(STUB)
    (bin_dir / "nsys").chmod(0o755)
    logs = tmp_path / "logs"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", GPUHPC_LOG_DIR=str(logs))
    proc = gpuhpc("submit", "--nodes", "2", "--partition", "all", "--template", "mpi", "--time", "2m",
                   "--mem", "100M", "--switches", "off", "--profile", "nsys", "--profile-steps", "3-7",
                   "--name", "profiled", "--json", "--", "python", "-c", "pass", env=env)
    assert proc.returncode == 0, proc.stderr
    job_id = json.loads(proc.stdout)["job_id"]
    track(job_id)
    wait_for(lambda: len(list((logs / "profile").glob(f"{job_id}-r0-rank*.nsys-rep"))) == 2, 120,
             lambda: f"both ranks' traces of job {job_id} (now {sorted(p.name for p in (logs / 'profile').glob('*'))})")
    reps = sorted((logs / "profile").glob(f"{job_id}-*.nsys-rep"))
    assert [p.name for p in reps] == [f"{job_id}-r0-rank0.nsys-rep", f"{job_id}-r0-rank1.nsys-rep"]
    for rank, p in enumerate(reps):
        argv, steps = p.read_text().splitlines()
        assert argv.startswith(f"profile -o {logs}/profile/{job_id}-r0-rank{rank} ")
        assert "--capture-range=cudaProfilerApi" in argv and argv.endswith("-- python -c pass")
        assert steps == "steps=3-7"
    listed = gpuhpc("profile", job_id, "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    got = json.loads(listed.stdout)
    assert [t["path"] for t in got["traces"]] == [str(p) for p in reps]
    assert got["traces"][0]["open"].startswith("nsys-ui ")
