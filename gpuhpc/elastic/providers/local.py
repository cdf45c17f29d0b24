"""The ``local`` provider: an "instance" is a ``slurmd -D -b -N NODE`` process on this host (the
node's own Port= from slurm.conf), as the local test cluster runs its nodes; for CI, demos and lab
hosts. Its registry is one JSON file per instance under ``<state_dir>/local``.

Fault injection for tests and demos: ``<state_dir>/local-faults.json`` maps a pool to
``{"mode": "capacity", "code": "InsufficientInstanceCapacity"}`` (the launch fails at once) or
``{"mode": "never_boot"}`` (the instance exists, its slurmd never starts) or
``{"mode": "slow_boot", "seconds": 2}`` (an emulated boot time before slurmd starts)."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.providers.base import (TAG_CLUSTER, TAG_NODE, TAG_POOL, TAG_TOKEN, CapacityError, Instance)
from gpuhpc.fsutil import write_atomic
from gpuhpc.slurm.power import spawn_slurmd, stepd_pids


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:      # a zombie (our own unreaped child) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _stop(pid: int | None, wait: float = 3.0) -> None:
    """SIGTERM to the slurmd's session (it leads its own), SIGKILL if it is still there after ``wait`` s."""
    for sig, grace in ((signal.SIGTERM, wait), (signal.SIGKILL, 2.0)):
        if not _alive(pid):
            return
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)


def _descendants(roots: list[int]) -> list[int]:
    """``roots`` and every process below them (from /proc's parent pids)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        try:
            ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(") ", 1)[1].split()[1]) if d.isdigit() else None
        except (OSError, IndexError, ValueError):
            continue
        if ppid is not None:
            children.setdefault(ppid, []).append(int(d))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class LocalProvider:
    name = "local"

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config
        self.dir = Path(config.state_dir) / "local"

    def _faults(self) -> dict:
        try:
            return json.loads((Path(self.config.state_dir) / "local-faults.json").read_text())
        except (OSError, ValueError):
            return {}

    def _records(self) -> list[dict]:
        out = []
        for p in sorted(self.dir.glob("*.json")) if self.dir.is_dir() else []:
            try:
                out.append(json.loads(p.read_text()))
            except (OSError, ValueError):
                continue
        return out

    def _instance(self, rec: dict) -> Instance:
        tags = rec["tags"]
        state = "running" if _alive(rec.get("pid")) else ("pending" if rec.get("pid") is None else "terminated")
        return Instance(id=rec["id"], node=tags.get(TAG_NODE), pool=tags.get(TAG_POOL), state=state,
                        launched_at=rec["launched_at"], instance_type="local", market=rec.get("market", "on_demand"),
                        addr="127.0.0.1", interrupted_at=rec.get("interrupted_at"))

    def launch(self, pool: Pool, nodes: list[str], token: str, *, each: bool = False) -> list[Instance]:
        # ``each`` (best effort) launches the same here: a local pool has room for all or none
        fault = self._faults().get(pool.name) or {}
        if fault.get("mode") == "capacity":
            raise CapacityError(fault.get("code", "InsufficientInstanceCapacity"), f"local pool {pool.name}")
        self.dir.mkdir(parents=True, exist_ok=True)
        out = []
        for node in nodes:
            iid = f"local-{node}-{token[-12:]}"
            path = self.dir / f"{iid}.json"
            if path.exists():                                   # the same launch again: idempotent
                out.append(self._instance(json.loads(path.read_text())))
                continue
            if fault.get("mode") == "slow_boot":               # an emulated boot time (bench/elastic.py)
                time.sleep(float(fault.get("seconds", 2)))
            pid = None if fault.get("mode") == "never_boot" else spawn_slurmd(node)
            rec = {"id": iid, "pid": pid, "launched_at": time.time(), "market": pool.market,
                   "tags": {TAG_CLUSTER: self.config.cluster, TAG_NODE: node, TAG_POOL: pool.name, TAG_TOKEN: token}}
            write_atomic(path, json.dumps(rec), mode=0o600)
            out.append(self._instance(rec))
        return out

    def terminate(self, instance_ids: list[str]) -> list[str]:
        done = []
        wanted = set(instance_ids)
        for rec in self._records():
            if rec["id"] not in wanted or rec["tags"].get(TAG_CLUSTER) != self.config.cluster:
                continue
            _stop(rec.get("pid"))
            (self.dir / f"{rec['id']}.json").unlink(missing_ok=True)
            done.append(rec["id"])
        return done

    def instances(self) -> list[Instance]:
        return [i for i in (self._instance(r) for r in self._records()
                            if r["tags"].get(TAG_CLUSTER) == self.config.cluster) if i.state != "terminated"]

    def interrupt(self, instance_id: str, at: float | None = None) -> None:
        """Stand in for a spot interruption notice (what EC2 sends two minutes before a reclaim)."""
        path = self.dir / f"{instance_id}.json"
        rec = json.loads(path.read_text())
        rec["interrupted_at"] = at if at is not None else time.time()
        write_atomic(path, json.dumps(rec), mode=0o600)

    def reclaim(self, instance_id: str) -> list[int]:
        """Stand in for a spot reclaim with no notice: the machine is gone at once. SIGKILL the
        node's slurmstepds and their jobs first, then its slurmd (a kill that left slurmstepd alive
        would end the job FAILED instead of requeued). The record stays: the instance now lists as
        terminated, and the reconciler finds the node's instance gone. Returns the pids killed."""
        rec = json.loads((self.dir / f"{instance_id}.json").read_text())
        node = rec["tags"][TAG_NODE]
        killed = []
        for pid in _descendants(stepd_pids(node)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        pid = rec.get("pid")
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
                killed.append(pid)
        deadline = time.monotonic() + 5
        while any(_alive(p) for p in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        return killed

