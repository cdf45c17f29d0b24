"""The worker carries out a resume's launches side by side (issue 38.3: 500 jobs' fleets one after
another take minutes on EC2): ``run_plans`` runs up to ``at_once`` plans at once, makes each
provider once, and loses no record when the launches finish together."""
from __future__ import annotations

import json
import threading

from gpuhpc.elastic import worker
from gpuhpc.elastic.config import ElasticConfig, Pool
from gpuhpc.elastic.power import resume_plans
from gpuhpc.elastic.providers.base import Instance
from gpuhpc.elastic.store import Store

from .fakes import RecordingSlurm

N = 6


class GatedProvider:
    """Each launch waits until ``N`` launches are in flight together (a barrier with a deadline:
    launches one by one would break it, and each would then fail)."""

    def __init__(self):
        self.barrier = threading.Barrier(N, timeout=20)
        self.made = 0

    def launch(self, pool, nodes, token, each=False):
        self.barrier.wait()
        return [Instance(f"i-{n}", n, pool.name, "pending", 1.0, "t") for n in nodes]

    def terminate(self, ids):
        return ids


def test_launches_run_side_by_side_and_every_record_is_kept(tmp_path, monkeypatch):
    provider = GatedProvider()

    def make(name, config):
        provider.made += 1
        return provider

    monkeypatch.setattr(worker, "provider_for", make)
    names = tuple(f"n{i}" for i in range(2 * N))
    cfg = ElasticConfig(cluster="c", state_dir=str(tmp_path), pools=(Pool("p", names, "x"),))
    store = Store(tmp_path)
    jobs = json.dumps({"jobs": [{"job_id": 10 + i, "nodes": f"n{2 * i},n{2 * i + 1}"} for i in range(N)]})
    plans = resume_plans(cfg, list(names), jobs, store, now=100.0)       # two-node jobs: one launch each
    assert len(plans) == N
    slurm = RecordingSlurm()
    worker.run_plans(cfg, plans, slurm, at_once=N)
    assert provider.made == 1 and not provider.barrier.broken
    assert {n: r.instance_id for n, r in store.read().nodes.items()} == {n: f"i-{n}" for n in names}
    assert sorted(c[1] for c in slurm.calls if c[0] == "update") == sorted(names)
    assert not [c for c in slurm.calls if c[0] == "down"]
