"""Profiling switches: the wrapped command, one nsys command per rank with distinct names and the
step window, the spec's checks, trace listing."""
from pathlib import Path

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs import profile
from gpuhpc.jobs.api import with_profile
from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec


def test_rank_commands_are_distinct_per_rank_and_restart():
    names = set()
    for restart in ("0", "1"):
        for rank in range(4):
            env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": str(rank), "SLURM_RESTART_COUNT": restart}
            argv, extra = profile.rank_command("nsys", "5-9", "/d/profile", ["python", "t.py"], env)
            assert argv[:4] == ["nsys", "profile", "-o", f"/d/profile/77-r{restart}-rank{rank}"]
            assert "--capture-range=cudaProfilerApi" in argv and argv[-3:] == ["--", "python", "t.py"]
            assert extra["GPUHPC_PROFILE_STEPS"] == "5-9"
            names.add(argv[3])
    assert len(names) == 8
    # torchrun workers: RANK wins over SLURM_PROCID (one srun task per node)
    argv, extra = profile.rank_command("torch", "1-2", "/d", ["python", "t.py"],
                                       {"SLURM_JOB_ID": "8", "SLURM_PROCID": "0", "RANK": "5"})
    assert argv == ["python", "t.py"] and extra["GPUHPC_PROFILE_OUTPUT"] == "/d/8-r0-rank5.pt.trace.json"


def test_spec_and_rendered_script(tmp_path):
    spec = JobSpec(command=("python", "train.py"), profile="nsys", profile_steps="3-7", log_dir=str(tmp_path),
                   template="mpi", resources={"nodes": 2})
    script = render(with_profile(spec))
    assert f"-m gpuhpc.jobs.profile --tool nsys --steps 3-7 --dir {tmp_path}/profile -- python train.py" in script
    assert with_profile(with_profile(spec)) == with_profile(spec)
    assert with_profile(JobSpec(command=("true",))).command == ("true",)


@pytest.mark.parametrize("kw, field", [({"profile": "perf"}, "profile"), ({"profile_steps": "1-2"}, "profile_steps"),
                                       ({"profile": "nsys", "profile_steps": "9-3"}, "profile_steps")])
def test_bad_profile_fields(kw, field):
    with pytest.raises(UserInputError) as exc:
        JobSpec(command=("true",), **kw)
    assert exc.value.field == field


def test_traces_and_open_commands(tmp_path):
    for n in ("12-r0-rank0.nsys-rep", "12-r0-rank1.nsys-rep", "12-r1-rank0.pt.trace.json", "123-r0-rank0.nsys-rep"):
        (tmp_path / n).write_text("x")
    got = profile.traces(str(tmp_path), "12")
    assert [p.name for p in got] == ["12-r0-rank0.nsys-rep", "12-r0-rank1.nsys-rep", "12-r1-rank0.pt.trace.json"]
    assert profile.open_command(got[0]).startswith("nsys-ui ")
    assert "perfetto" in profile.open_command(got[2])


def test_step_is_a_no_op_unprofiled(monkeypatch):
    import sys

    monkeypatch.delenv("GPUHPC_PROFILE", raising=False)
    monkeypatch.setenv("GPUHPC_PROFILE_STEPS", "2-5")
    for i in range(8):        # across the window: nothing starts, torch is never imported
        profile.step(i)
    assert "torch" not in sys.modules


def test_torch_profile_renders_one_wrapped_rank_per_worker(tmp_path, capsys):
    spec = JobSpec(command=("python", "train.py"), profile="torch", profile_steps="2-4", log_dir=str(tmp_path),
                   template="torchrun", resources={"nodes": 2, "gpus": 4})
    script = render(with_profile(spec))
    assert f"-m gpuhpc.jobs.profile --tool torch --steps 2-4 --dir {tmp_path}/profile -- python train.py" in script
    outs = set()
    for rank in range(8):        # torchrun's workers: RANK 0..7 over 2 nodes x 4 GPUs
        env = {"SLURM_JOB_ID": "31", "SLURM_PROCID": str(rank // 4), "RANK": str(rank)}
        argv, extra = profile.rank_command("torch", "2-4", f"{tmp_path}/profile", ["python", "train.py"], env)
        assert argv == ["python", "train.py"] and extra["GPUHPC_PROFILE"] == "torch"
        outs.add(extra["GPUHPC_PROFILE_OUTPUT"])
    assert outs == {f"{tmp_path}/profile/31-r0-rank{r}.pt.trace.json" for r in range(8)}
    assert profile.main(["--tool", "torch", "--steps", "2-4", "--dir", "/d", "--print", "--", "python", "t.py"]) == 0
    assert "GPUHPC_PROFILE_OUTPUT=/d/" in capsys.readouterr().out


TORCH_LOOP = """
from gpuhpc.jobs import profile
import torch
for i in range({steps}):
    profile.step(i)
    with torch.profiler.record_function(f"step {{i}}"):
        pass
"""
# PyTorch's subset that gpuhpc.jobs.profile calls, for its runtime path where torch is not installed
TORCH_STANDIN = Path(__file__).resolve().parents[2] / "standins" / "torch_profiler"


@pytest.mark.parametrize("steps, recorded", [(6, [1, 2, 3]),     # the whole window 1-4: steps 1..3
                                             (3, [1, 2])])       # a program that ends inside it: at exit
def test_torch_profiler_writes_one_trace_per_rank_of_the_step_window(tmp_path, steps, recorded):
    """The runtime path: each rank's ``torch.profiler`` (the ``torch`` stand-in in
    tests/standins/torch_profiler: torch is not a test dependency) starts at the window's first
    step, stops at its last (or at exit inside it) and writes its own Chrome trace."""
    import json
    import os
    import subprocess
    import sys

    procs = []
    for rank in range(2):
        env = dict(os.environ, SLURM_JOB_ID="55", RANK=str(rank),
                   PYTHONPATH=os.pathsep.join([str(TORCH_STANDIN), *filter(None, [os.environ.get("PYTHONPATH")])]))
        env.pop("SLURM_RESTART_COUNT", None)
        procs.append(subprocess.Popen([sys.executable, "-m", "gpuhpc.jobs.profile", "--tool", "torch", "--steps", "1-4",
                                       "--dir", str(tmp_path), "--", sys.executable, "-c",
                                       TORCH_LOOP.format(steps=steps)], env=env, stderr=subprocess.PIPE, text=True))
    assert [(p.wait(timeout=60), p.stderr.read()) for p in procs] == [(0, ""), (0, "")]
    got = [p.name for p in profile.traces(str(tmp_path), "55")]
    assert got == ["55-r0-rank0.pt.trace.json", "55-r0-rank1.pt.trace.json"]
    for name in got:
        events = json.loads((tmp_path / name).read_text())["traceEvents"]
        assert [e["name"] for e in events if e.get("cat") == "user_annotation"] == [f"step {i}" for i in recorded]
