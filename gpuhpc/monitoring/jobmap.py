"""The GPU-to-job mapping directory that Slurm's Prolog and Epilog maintain and the GPU
exporter reads (dcgm-exporter's job-mapping idea, with MIG instances included).

One directory per Slurm node (several ``slurmd -N`` may share a host), one file per GRES
index the job holds (``$SLURM_JOB_GPUS`` in the Prolog: the node's GPUs, or MIG instances,
in gres.conf order), holding ``{"job_id": ..., "user": ...}``::

    /run/gpuhpc/jobmap/gpu-node1/0   {"job_id": "1044", "user": "alice"}

``python -m gpuhpc.monitoring.jobmap prolog|epilog`` is the hook: it reads ``SLURMD_NODENAME``,
``SLURM_JOB_ID``, ``SLURM_JOB_USER`` and ``SLURM_JOB_GPUS`` (``CUDA_VISIBLE_DEVICES`` when that
is unset) as Slurm sets them; the epilog removes only files that still name its job.
"""
from __future__ import annotations

import json
import os
import sys

from gpuhpc.config import getenv

DEFAULT_DIR = "/run/gpuhpc/jobmap"
ENV_DIR = "GPUHPC_JOBMAP_DIR"


def base_dir() -> str:
    return getenv(ENV_DIR) or DEFAULT_DIR


def node_dir(node: str, base: str | None = None) -> str:
    if not node or "/" in node or node.startswith("."):
        raise ValueError(f"bad node name {node!r}")
    return os.path.join(base or base_dir(), node)


def parse_indexes(text: str | None) -> list[int]:
    """``0,1,5`` (or ``0-3,5``) -> [0, 1, 5]; empty/None -> []."""
    from gpuhpc.hostlist import expand_ranges

    text = (text or "").strip()
    if not text or text.lower() in ("n/a", "(null)"):
        return []
    return expand_ranges(text)


def assign(node: str, job_id: str, user: str, indexes: list[int], base: str | None = None) -> None:
    from gpuhpc.fsutil import check_root_dir, write_atomic

    # the Prolog runs as root: never write into a directory a user made or can write
    check_root_dir(base or base_dir())
    d = str(check_root_dir(node_dir(node, base)))
    body = json.dumps({"job_id": str(job_id), "user": user})
    for i in indexes:
        write_atomic(os.path.join(d, str(int(i))), body, 0o644)     # the GPU exporter reads it


def release(node: str, job_id: str, indexes: list[int] | None = None, base: str | None = None) -> None:
    """Remove the node's mapping files that name ``job_id`` (all of them when ``indexes`` is None)."""
    from gpuhpc.fsutil import check_root_dir

    d = node_dir(node, base)
    if not os.path.lexists(d):
        return
    check_root_dir(base or base_dir(), create=None)     # the Epilog runs as root, as the Prolog
    check_root_dir(d, create=None)
    current = read(node, base)
    for i, rec in current.items():
        if rec.get("job_id") == str(job_id) and (indexes is None or i in indexes):
            try:
                os.unlink(os.path.join(d, str(i)))
            except FileNotFoundError:
                pass


def read(node: str, base: str | None = None) -> dict[int, dict]:
    """{gres index: {"job_id", "user"}} for ``node`` (empty when the directory is absent)."""
    d = node_dir(node, base)
    out: dict[int, dict] = {}
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            with open(fd, encoding="utf-8") as fh:
                rec = json.loads(fh.read(4096))       # a map file is one short JSON object
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict):
            out[int(name)] = rec
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("prolog", "epilog"):
        sys.stderr.write("usage: python -m gpuhpc.monitoring.jobmap prolog|epilog (Slurm's environment)\n")
        return 2
    env = os.environ
    node = env.get("SLURMD_NODENAME") or ""
    job = env.get("SLURM_JOB_ID") or ""
    if not node or not job:
        sys.stderr.write("jobmap: SLURMD_NODENAME and SLURM_JOB_ID must be set\n")
        return 2
    idx = parse_indexes(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES"))
    try:
        if args[0] == "prolog":
            assign(node, job, env.get("SLURM_JOB_USER", ""), idx)
        else:
            release(node, job)
    except PermissionError as exc:      # a map directory a user made or can write: not used
        sys.stderr.write(f"jobmap: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
