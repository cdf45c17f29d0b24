"""The programs Slurm runs: ``gpuhpc power resume|suspend|resume-fail HOSTLIST``.

Each one returns within a fraction of a second (slurmctld waits for none of them, but a slow one
holds its power-save thread): it reads ``SLURM_RESUME_FILE`` at once (Slurm removes it when the
program exits), notes what it asked for in the :class:`~gpuhpc.elastic.store.Store`, writes a
plan and leaves the provider calls and node updates to a detached worker
(:mod:`gpuhpc.elastic.worker`). Running a program twice for the same nodes (slurmctld restarted)
launches nothing twice: a node with a live record is skipped, and a launch's token makes the
provider call idempotent."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuhpc import hostlist
from gpuhpc.elastic.config import CONFIG_ENV, ElasticConfig
from gpuhpc.elastic.resumefile import plan_launches
from gpuhpc.elastic.store import NodeRecord, Store
from gpuhpc.fsutil import write_atomic

RESUME_FILE_ENV = "SLURM_RESUME_FILE"
CAP_REASON = "gpuhpc max_nodes"      # the reason on a node whose launch max_nodes refused


def cap_reason(pool: str, in_use: int, max_nodes: int, asked: int) -> str:
    """The Reason a node refused for ``max_nodes`` carries (the reconciler matches its prefix)."""
    more = f", {asked} more asked" if asked else ""
    return f"{CAP_REASON} pool {pool}: {in_use} of {max_nodes} in use{more}"


@dataclass(frozen=True)
class Plan:
    """One unit of work for the worker."""
    op: str                       # launch | refuse (past max_nodes) | terminate | failed
    pool: str
    nodes: tuple[str, ...]
    token: str
    job_id: str | None = None
    instance_ids: tuple[str, ...] = ()
    reason: str = ""
    each: bool = False            # a launch of single-node jobs batched: best effort per node


BATCH_MAX = 500     # nodes per batched launch (ParallelCluster's default launch batch size)


def _token(cluster: str, job_id: str | None, nodes: tuple[str, ...], now: float) -> str:
    digest = hashlib.sha1(",".join(nodes).encode()).hexdigest()[:8]
    return f"{cluster}-{job_id or 'n'}-{digest}-{int(now)}"


def resume_plans(config: ElasticConfig, nodes: list[str], resume_text: str | None, store: Store,
                 now: float) -> list[Plan]:
    """The launches for ``nodes``, recorded in ``store``: one per multi-node job and pool, all or
    nothing; the single-node jobs (and nodes no job named) of a pool together, in one best-effort
    launch per pool and call (``each``; up to :data:`BATCH_MAX` nodes), so 500 one-GPU jobs are one
    CreateFleet, not 500. Nodes that already have a live record (a second call for the same
    resume) and nodes of no cloud pool are left out. A launch that would take a pool past its
    ``max_nodes`` (records held: launches asked for, in flight or up) is refused: a multi-node
    job whole, every pool of it; single-node jobs each, the ones past the cap. A ``refuse`` plan
    records nothing (the worker sets its nodes DOWN with the reason)."""
    plans = []
    singles: dict[str, list[tuple[str, str | None]]] = {}      # pool -> (node, job id), in order
    with store.update() as state:
        for launch in plan_launches(nodes, resume_text):
            by_pool: dict[str, list[str]] = {}
            for n in launch.nodes:
                pool = config.pool_of(n)
                rec = state.nodes.get(n)
                if pool is None or (rec is not None and now - rec.requested_at < config.resume_timeout):
                    continue
                by_pool.setdefault(pool.name, []).append(n)
            if len(launch.nodes) == 1:
                for pool_name, members in by_pool.items():
                    singles.setdefault(pool_name, []).append((members[0], launch.job_id))
                continue
            refused = None
            for pool_name, members in by_pool.items():
                cap = config.pool(pool_name).max_nodes
                in_use = sum(1 for r in state.nodes.values() if r.pool == pool_name and r.node not in members)
                if cap and in_use + len(members) > cap:
                    refused = cap_reason(pool_name, in_use, cap, len(members))
                    break
            if refused:
                for pool_name, members in by_pool.items():
                    for n in members:
                        state.nodes.pop(n, None)          # a stale record of a refused node: gone with it
                    plans.append(Plan("refuse", pool_name, tuple(members), _token(config.cluster, launch.job_id,
                                                                                  tuple(members), now),
                                      launch.job_id, reason=refused))
                continue
            for pool_name, members in by_pool.items():
                token = _token(config.cluster, launch.job_id, tuple(members), now)
                for n in members:
                    state.nodes[n] = NodeRecord(node=n, pool=pool_name, token=token, requested_at=now,
                                                job_id=launch.job_id)
                plans.append(Plan("launch", pool_name, tuple(members), token, launch.job_id))
        for pool_name, wanted in singles.items():
            cap = config.pool(pool_name).max_nodes
            names = {n for n, _ in wanted}
            in_use = sum(1 for r in state.nodes.values() if r.pool == pool_name and r.node not in names)
            room = len(wanted) if not cap else max(0, cap - in_use)
            fit, over = wanted[:room], wanted[room:]
            if over:
                members = tuple(n for n, _ in over)
                for n in members:
                    state.nodes.pop(n, None)
                plans.append(Plan("refuse", pool_name, members, _token(config.cluster, None, members, now),
                                  reason=cap_reason(pool_name, in_use + len(fit), cap, len(over))))
            for i in range(0, len(fit), BATCH_MAX):
                chunk = fit[i:i + BATCH_MAX]
                members = tuple(n for n, _ in chunk)
                token = _token(config.cluster, chunk[0][1] if len(chunk) == 1 else None, members, now)
                for n, job_id in chunk:
                    state.nodes[n] = NodeRecord(node=n, pool=pool_name, token=token, requested_at=now, job_id=job_id)
                plans.append(Plan("launch", pool_name, members, token, chunk[0][1] if len(chunk) == 1 else None,
                                  each=len(chunk) > 1))
    return plans


def release_plans(config: ElasticConfig, nodes: list[str], store: Store, now: float, *, failed: bool) -> list[Plan]:
    """Suspend (``failed`` False) or resume-fail: forget the nodes' records and end their instances."""
    by_pool: dict[str, tuple[list[str], list[str]]] = {}
    with store.update() as state:
        for n in nodes:
            pool = config.pool_of(n)
            if pool is None:
                continue
            rec = state.nodes.pop(n, None)
            state.interrupted.pop(n, None)
            names, ids = by_pool.setdefault(pool.name, ([], []))
            names.append(n)
            if rec is not None and rec.instance_id:
                ids.append(rec.instance_id)
                state.releasing[rec.instance_id] = now       # not an orphan while the worker ends it
    op = "failed" if failed else "terminate"
    reason = f"gpuhpc: no registration within ResumeTimeout ({config.resume_timeout}s)" if failed else ""
    return [Plan(op, pool, tuple(names), _token(config.cluster, None, tuple(names), now), None, tuple(ids), reason)
            for pool, (names, ids) in by_pool.items()]


def spawn_worker(config_path: str | None, state_dir: str, plans: list[Plan]) -> int | None:
    """Write the plans and start ``python -m gpuhpc.elastic.worker PLANFILE`` in its own session
    (no inherited pipes: slurmctld does not wait for it). Returns its pid, None when no plan."""
    if not plans:
        return None
    plan_dir = Path(state_dir) / "plans"
    plan_dir.mkdir(parents=True, exist_ok=True)
    path = plan_dir / f"{plans[0].token}-{os.getpid()}.json"
    write_atomic(path, json.dumps({"config": config_path, "plans": [asdict(p) for p in plans]}), mode=0o600)
    env = {k: v for k, v in os.environ.items() if k != RESUME_FILE_ENV}
    if config_path:
        env[CONFIG_ENV] = config_path
    log = open(Path(state_dir) / "worker.log", "ab")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "gpuhpc.elastic.worker", str(path)], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, start_new_session=True, close_fds=True, env=env)
    finally:
        log.close()
    return proc.pid


def run_program(which: str, nodes_expr: str, config: ElasticConfig, config_path: str | None,
                *, spawn: bool = True, now: float | None = None) -> list[Plan]:
    """What ``gpuhpc power resume|suspend|resume-fail HOSTLIST`` does."""
    now = time.time() if now is None else now
    nodes = hostlist.expand(nodes_expr, field="HOSTLIST")
    store = Store(config.state_dir)
    if which == "resume":
        text = None
        path = os.environ.get(RESUME_FILE_ENV)
        if path:
            try:
                text = Path(path).read_text()
            except OSError:
                text = None
        plans = resume_plans(config, nodes, text, store, now)
    else:
        plans = release_plans(config, nodes, store, now, failed=(which == "resume-fail"))
    if spawn:
        spawn_worker(config_path, config.state_dir, plans)
    return plans
