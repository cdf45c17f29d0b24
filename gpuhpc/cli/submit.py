"""``gpuhpc submit``: render a job template and sbatch it.

The options are parsed by one stdlib ``argparse`` parser (:func:`parser`); ``gpuhpc submit``
imports neither typer nor rich (it must not be much slower than ``sbatch``).

    gpuhpc submit --gpus 8 --gpu-type h100 --nodes 2 --time 2h --partition gpu \\
        --account proj-x -- python train.py --lr 3e-4
"""
from __future__ import annotations

import argparse
import functools
import sys
from typing import Any

# CLI option -> (JobSpec/Resources field, where). "res" = Resources, "spec" = JobSpec.
_FIELDS: dict[str, tuple[str, str]] = {
    "gpus": ("gpus", "res"), "gpu_type": ("gpu_type", "res"), "nodes": ("nodes", "res"),
    "time": ("time", "res"), "partition": ("partition", "res"), "account": ("account", "res"),
    "qos": ("qos", "res"), "mem": ("mem", "res"), "cpus_per_task": ("cpus_per_task", "res"),
    "tasks_per_node": ("tasks_per_node", "res"), "constraint": ("constraint", "res"),
    "nodelist": ("nodelist", "res"), "exclude": ("exclude", "res"), "exclusive": ("exclusive", "res"),
    "name": ("name", "spec"), "template": ("template", "spec"), "workdir": ("workdir", "spec"),
    "log_dir": ("log_dir", "spec"), "checkpoint_dir": ("checkpoint_dir", "spec"),
    "grace": ("grace", "spec"), "max_requeues": ("max_requeues", "spec"),
    "requeue": ("requeue", "spec"), "hold": ("hold", "spec"), "dependency": ("dependency", "spec"),
    "mpi": ("mpi", "spec"), "array": ("array", "spec"), "snapshot": ("snapshot", "spec"), "snapshot_path": ("snapshot_paths", "spec"),
}


@functools.cache
def parser() -> argparse.ArgumentParser:
    """The ``gpuhpc submit`` option parser (built once; parsing does not change it)."""
    from gpuhpc.cli._args import ArgParser

    p = ArgParser("gpuhpc submit",
                  description="Render a job template (job-templates/) and submit it with sbatch. "
                              "Put the command after --. Options override a --file job file.",
                  epilog="Jobs get --requeue and --signal=B:USR2@GRACE: on preemption or near the "
                         "time limit the program receives SIGUSR2, checkpoints to "
                         "$GPUHPC_CHECKPOINT_DIR and exits; the job requeues itself (docs/jobs.md).")
    a = p.add_argument
    g = p.add_argument_group("resources (per node where it applies)")
    g.add_argument("--gpus", type=int, metavar="N", help="GPUs per node")
    g.add_argument("--gpu-type", metavar="TYPE", help="GPU model (h100) or MIG profile (1g.10gb)")
    g.add_argument("--nodes", "-N", type=int, metavar="N")
    g.add_argument("--time", "-t", metavar="DURATION", help="time limit: 2h, 90m, 1d, 02:00:00 (default 1h)")
    g.add_argument("--partition", "-p")
    g.add_argument("--account", "-A")
    g.add_argument("--qos")
    g.add_argument("--mem", help="memory per node: 64G")
    g.add_argument("--cpus-per-task", "-c", type=int, metavar="N")
    g.add_argument("--tasks-per-node", type=int, metavar="N",
                   help="default: 1 (single, torchrun), GPUs per node (deepspeed, mpi)")
    g.add_argument("--constraint", "-C")
    g.add_argument("--nodelist", "-w")
    g.add_argument("--exclude", "-x")
    g.add_argument("--exclusive", action="store_true", default=None)
    j = p.add_argument_group("job")
    j.add_argument("--file", "-f", metavar="JOB.yaml", help="YAML job file with the same option names")
    j.add_argument("--name", "-J")
    j.add_argument("--template", choices=("single", "torchrun", "deepspeed", "mpi"))
    j.add_argument("--mpi", choices=("auto", "pmix", "pmi2"), help="MPI plugin for the mpi template")
    j.add_argument("--env", "-e", action="append", metavar="KEY=VALUE", help="export in the job (repeatable)")
    j.add_argument("--workdir", "-D")
    j.add_argument("--log-dir", metavar="DIR", help="where %%j.out logs go (default ~/.local/share/gpuhpc/logs)")
    j.add_argument("--checkpoint-dir", metavar="DIR", help="shared checkpoint dir; %%j = job id")
    j.add_argument("--grace", metavar="DURATION", help="SIGUSR2 this long before the time limit (default 60s)")
    j.add_argument("--max-requeues", type=int, metavar="N", help="cap on requeues (default 10)")
    j.add_argument("--no-requeue", dest="requeue", action="store_false", default=None)
    j.add_argument("--hold", action="store_true", default=None)
    j.add_argument("--dependency", "-d")
    j.add_argument("--array", "-a", metavar="INDEXES",
                   help="a job array (0-49%%8: 50 tasks, 8 at a time); the ledger holds every task")
    j.add_argument("--snapshot", action=argparse.BooleanOptionalAction, default=None,
                   help="run from a code snapshot of this git repo (tracked files, uncommitted changes; "
                        ".gpuhpcignore excludes); default: on over SSH (--cluster), off locally")
    j.add_argument("--snapshot-path", action="append", metavar="PATH",
                   help="also put PATH (file or directory) in the snapshot (repeatable)")
    o = p.add_argument_group("output")
    o.add_argument("--dry-run", action="store_true", help="print the sbatch script; submit nothing")
    o.add_argument("--json", action="store_true", help="print {job_id, log} as JSON")
    a("command", nargs=argparse.REMAINDER, help="the command, after --")
    return p


def _load_file(path: str) -> dict[str, Any]:
    from gpuhpc.errors import UserInputError

    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise UserInputError(f"cannot read job file: {exc.strerror}", field="--file") from exc
    import yaml

    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise UserInputError(f"invalid YAML: {str(exc).splitlines()[0]}", field=path) from exc
    if not isinstance(data, dict):
        raise UserInputError("a job file must be a mapping of option: value", field=path)
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build_spec(ns: argparse.Namespace):
    """Job file first, then the flags that were given on the command line."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.jobs.spec import JobSpec

    data: dict[str, Any] = _load_file(ns.file) if ns.file else {}
    for opt, (fld, _) in _FIELDS.items():
        value = getattr(ns, opt, None)
        if value is not None:
            if "resources" in data and isinstance(data["resources"], dict) and _FIELDS[opt][1] == "res":
                data["resources"][fld] = value
            else:
                data[fld] = value
    if ns.env:
        env = dict(data.get("env") or {})
        for item in ns.env:
            if "=" not in item:
                raise UserInputError(f"expected KEY=VALUE, got {item!r}", field="--env")
            k, v = item.split("=", 1)
            env[k] = v
        data["env"] = env
    cmd = list(ns.command or [])
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if cmd:
        data["command"] = cmd
    return JobSpec.from_mapping(data)


def run(argv: list[str]) -> int:
    """Parse ``argv`` (everything after ``submit``), submit, print. Raises GpuhpcError."""
    from gpuhpc.cli._args import parse

    ns = parse(parser(), argv)
    if isinstance(ns, int):         # --help
        return ns
    spec = build_spec(ns)
    if ns.dry_run:
        from gpuhpc.jobs.render import render

        sys.stdout.write(render(spec))
        return 0
    from gpuhpc.jobs.api import submit_spec

    job = submit_spec(spec)
    if ns.json:
        import json

        sys.stdout.write(json.dumps({"job_id": job.job_id, "name": spec.name, "log": job._log_path}) + "\n")
    else:
        sys.stdout.write(f"{job.job_id}\n")
        sys.stderr.write(f"submitted job {job.job_id} ({spec.template}); log: {job._log_path}\n")
    snap = getattr(job, "snapshot", None)
    if snap is not None:
        sys.stderr.write(snap.summary() + "\n")
    return 0


def main(argv: list[str], debug: bool = False) -> int:
    """``gpuhpc submit ...`` (``argv[0]`` is ``submit``), errors mapped to exit codes; no typer,
    no rich (:mod:`gpuhpc.cli.main` dispatches here)."""
    from gpuhpc.cli import run_guarded

    return run_guarded(lambda: run(argv[1:]), lambda: debug)


if __name__ == "__main__":
    sys.exit(main(["submit", *sys.argv[1:]]))
