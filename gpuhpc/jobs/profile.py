"""Profiling switches: ``profile: nsys|torch`` in a job spec, ``--profile`` on ``gpuhpc submit``.

Submission wraps the job's command (:func:`wrap`) in ``python -m gpuhpc.jobs.profile``, which
runs in every rank (srun task or torchrun worker) and there:

* ``nsys``: execs ``nsys profile -o <log dir>/profile/<job>-r<restart>-rank<rank>
  --capture-range=cudaProfilerApi --capture-range-end=stop ... -- COMMAND`` (:func:`rank_command`);
  the program (or :func:`step`) starts and stops the CUDA profiler at the step window;
* ``torch``: execs the command with ``GPUHPC_PROFILE=torch`` and the trace's path; :func:`step`
  records the window with ``torch.profiler`` and writes ``<job>-r<restart>-rank<rank>.pt.trace.json``.

The window comes from ``GPUHPC_PROFILE_STEPS`` (``START-STOP``, default ``10-20``); the user's
loop calls ``gpuhpc.jobs.profile.step(i)`` once per step. ``gpuhpc profile JOBID`` lists the
traces and prints the command that opens them.
"""
from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuhpc.config import getenv
from gpuhpc.errors import UserInputError

TOOLS = ("nsys", "torch")
DEFAULT_STEPS = "10-20"
_STEPS_RE = re.compile(r"^(\d{1,9})-(\d{1,9})$")
SUFFIX = {"nsys": ".nsys-rep", "torch": ".pt.trace.json"}


def parse_steps(text: str | None, field: str = "profile_steps") -> tuple[int, int]:
    m = _STEPS_RE.match(str(text or DEFAULT_STEPS).strip())
    if not m or int(m.group(1)) >= int(m.group(2)):
        raise UserInputError(f"{text!r} is not a step window START-STOP with START < STOP", field=field,
                             hint="e.g. 10-20")
    return int(m.group(1)), int(m.group(2))


def check(tool: str | None, steps: str | None) -> None:
    if tool is None:
        if steps is not None:
            raise UserInputError("a step window without a profiler", field="profile_steps", hint="add --profile nsys|torch")
        return
    if tool not in TOOLS:
        raise UserInputError(f"unknown profiler {tool!r}", field="profile", hint=f"valid: {', '.join(TOOLS)}")
    parse_steps(steps)


def profile_dir(log_directory: str) -> str:
    return os.path.join(log_directory, "profile")


def wrap(command: Sequence[str], tool: str, steps: str | None, log_directory: str,
         python: str | None = None) -> tuple[str, ...]:
    """The job's command behind the per-rank wrapper (what the templates run)."""
    check(tool, steps)
    a, b = parse_steps(steps)
    return (python or sys.executable, "-m", "gpuhpc.jobs.profile", "--tool", tool, "--steps", f"{a}-{b}",
            "--dir", profile_dir(log_directory), "--", *command)


def trace_stem(env: Mapping[str, str]) -> str:
    """``<job>-r<restart>-rank<rank>`` from Slurm's / torchrun's environment."""
    job = env.get("SLURM_ARRAY_JOB_ID") and f"{env['SLURM_ARRAY_JOB_ID']}_{env.get('SLURM_ARRAY_TASK_ID', '0')}" \
        or env.get("SLURM_JOB_ID", "nojob")
    rank = env.get("RANK") or env.get("SLURM_PROCID") or "0"
    return f"{job}-r{env.get('SLURM_RESTART_COUNT', '0') or '0'}-rank{rank}"


def rank_command(tool: str, steps: str, directory: str, command: Sequence[str],
                 env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) this rank runs."""
    a, b = parse_steps(steps)
    out = os.path.join(directory, trace_stem(env))
    extra = {"GPUHPC_PROFILE": tool, "GPUHPC_PROFILE_STEPS": f"{a}-{b}", "GPUHPC_PROFILE_OUTPUT": out + SUFFIX[tool]}
    if tool == "nsys":
        argv = ["nsys", "profile", "-o", out, "--force-overwrite=true", "--trace=cuda,nvtx,osrt",
                "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--", *command]
        return argv, extra
    return list(command), extra


# ---------------------------------------------------------------- inside the program
_state: dict[str, object] = {}


def window() -> tuple[int, int] | None:
    if not getenv("GPUHPC_PROFILE"):
        return None
    return parse_steps(getenv("GPUHPC_PROFILE_STEPS"), "GPUHPC_PROFILE_STEPS")


def step(i: int) -> None:
    """Call once per training step: starts the profiler at the window's first step and stops
    it (writing the trace) at its last. A no-op when the job is not profiled."""
    win = window()
    if win is None:
        return
    tool = getenv("GPUHPC_PROFILE")
    if i == win[0] and "on" not in _state:
        _state["on"] = _start(tool)
    elif i == win[1] and _state.get("on") is not None:
        _stop(tool, _state.pop("on"))


def _start(tool: str):
    import torch

    if tool == "nsys":
        torch.cuda.cudart().cudaProfilerStart()
        return True
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=acts)
    prof.__enter__()
    import atexit

    atexit.register(_stop_at_exit, tool)       # a program that ends inside the window still writes it
    return prof


def _stop_at_exit(tool: str) -> None:
    if _state.get("on") is not None:
        _stop(tool, _state.pop("on"))


def _stop(tool: str, handle) -> None:
    if tool == "nsys":
        import torch

        torch.cuda.cudart().cudaProfilerStop()
        return
    handle.__exit__(None, None, None)
    out = os.environ["GPUHPC_PROFILE_OUTPUT"]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    handle.export_chrome_trace(out)


def traces(directory: str, job_id: str) -> list[Path]:
    d = Path(directory)
    if not d.is_dir():
        return []
    pat = re.compile(rf"^{re.escape(job_id)}(_\d+)?-r\d+-rank\d+(\.nsys-rep|\.qdrep|\.pt\.trace\.json)$")
    return sorted((p for p in d.iterdir() if pat.match(p.name)), key=lambda p: p.name)


def open_command(path: Path) -> str:
    import shlex

    if path.name.endswith(".pt.trace.json"):
        return f"# open in https://ui.perfetto.dev or chrome://tracing: {shlex.quote(str(path))}"
    return f"nsys-ui {shlex.quote(str(path))}    # or: nsys stats {shlex.quote(str(path))}"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gpuhpc.jobs.profile")
    ap.add_argument("--tool", choices=TOOLS, required=True)
    ap.add_argument("--steps", default=DEFAULT_STEPS)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--print", action="store_true", help="print this rank's command instead of running it")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not cmd:
        ap.error("no command after --")
    args, extra = rank_command(a.tool, a.steps, a.dir, cmd, os.environ)
    if a.print:
        import shlex

        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()), shlex.join(args))
        return 0
    os.makedirs(a.dir, exist_ok=True)
    os.environ.update(extra)
    try:
        os.execvp(args[0], args)
    except FileNotFoundError:
        sys.stderr.write(f"gpuhpc profile: {args[0]} not found on {os.uname().nodename}\n")
        return 127


if __name__ == "__main__":
    raise SystemExit(main())
