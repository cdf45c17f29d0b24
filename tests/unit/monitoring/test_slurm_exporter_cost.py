"""What the Slurm exporter costs slurmctld and the slurmds (issue 35.3): one look at the cluster
(nodes + queue) per TTL however many scrapes come, sstat never on a scrape's path and at most once
per usage interval, and a Slurm timeout below Prometheus' scrape timeout. A fake client counts
the calls; the clock is simulated."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuhpc.errors import SlurmError
from gpuhpc.monitoring.slurm_exporter import SlurmCollector
from gpuhpc.slurm.parsers import parse_nodes
from gpuhpc.slurm.state import SlurmState
from gpuhpc.transport import CommandResult

NODES = """NodeName=gpu-node1 CPUTot=16 Gres=gpu:h100:8(S:0-1) State=MIXED Partitions=gpu,all AllocTRES=cpu=4,gres/gpu=2,gres/gpu:h100=2
NodeName=gpu-node2 CPUTot=16 Gres=gpu:h100:8(S:0-1) State=IDLE Partitions=gpu,all AllocTRES=
"""


class Row:
    def __init__(self, job_id, state):
        self.job_id, self.state, self.tres_per_node, self.nodes = job_id, SlurmState.parse(state), "gres:gpu:h100:2", 1
        self.partition, self.user, self.account = "gpu", "alice", "research"


class Client:
    def __init__(self):
        self.calls: list[str] = []
        self.fail = False

    def nodes(self):
        self.calls.append("nodes")
        if self.fail:
            raise SlurmError("scontrol show node failed")
        return parse_nodes(NODES)

    def queue(self):
        self.calls.append("queue")
        if self.fail:
            raise SlurmError("squeue failed")
        return [Row("11", "RUNNING"), Row("12", "PENDING")]

    def run(self, argv, **kw):
        self.calls.append(argv[0])
        return CommandResult(tuple(argv), 0, "11.batch|00:01:40|1|2G\n11.0|00:00:50|2|3G\n", "")


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def scrape(col) -> dict[str, list]:
    reg = CollectorRegistry()
    reg.register(col)
    return {f.name: f.samples for f in text_string_to_metric_families(generate_latest(reg).decode())}


def test_scrapes_inside_the_ttl_share_one_look_and_sstat_runs_once_per_interval():
    client, clock = Client(), Clock()
    col = SlurmCollector(client, ttl=4, usage_interval=30, background=False, clock=clock)
    for _ in range(3):                                    # an HA pair and a retry, within 4 s
        got = scrape(col)
        clock.t += 1
    assert client.calls == ["queue", "nodes", "sstat"]
    assert got["gpuhpc_slurm_job_cpu_used_seconds"][0].value == 200.0           # 100 s × 1 + 50 s × 2
    assert got["gpuhpc_slurm_job_memory_max_rss_bytes"][0].value == 3 * 2**30
    # every 5 s for a minute: a look per scrape (TTL < interval), sstat every 30 s
    client.calls.clear()
    for _ in range(12):
        clock.t += 5
        scrape(col)
    assert client.calls.count("queue") == client.calls.count("nodes") == 12
    assert client.calls.count("sstat") == 2
    assert col.looks == 13 and col.usage_runs == 3


def test_a_failed_look_is_not_kept_and_the_timeouts_are_below_the_scrape_timeout(monkeypatch):
    client, clock = Client(), Clock()
    col = SlurmCollector(client, ttl=4, background=False, clock=clock)
    client.fail = True
    assert scrape(col)["gpuhpc_slurm_scrape_ok"][0].value == 0
    client.fail = False
    clock.t += 0.5                                        # inside the TTL: asked again, not a cached failure
    assert scrape(col)["gpuhpc_slurm_scrape_ok"][0].value == 1
    made = []

    class FakeSlurmClient:
        def __init__(self, runner=None, *, timeout=60.0):
            made.append(timeout)

    monkeypatch.setattr("gpuhpc.slurm.client.SlurmClient", FakeSlurmClient)
    SlurmCollector()
    assert made == [8.0, 30.0]                           # the scrape's commands: 8 s < Prometheus' 10 s


def test_sstat_runs_off_the_scrape_path():
    """With the background refresh a scrape never waits for sstat: the refresh thread is started
    and the scrape returns the usage it had."""
    import threading

    gate = threading.Event()

    class Slow(Client):
        def run(self, argv, **kw):
            gate.wait(10)                                 # a slow fan-out to the slurmds
            return super().run(argv, **kw)

    client, clock = Slow(), Clock()
    col = SlurmCollector(client, ttl=4, usage_interval=30, background=True, clock=clock)
    got = scrape(col)                                     # returns while sstat is blocked
    assert not got["gpuhpc_slurm_job_cpu_used_seconds"] and got["gpuhpc_slurm_scrape_ok"][0].value == 1
    gate.set()
    from polling import wait_for

    wait_for(lambda: col.usage_runs == 1, 10, "the background sstat refresh to end")
    clock.t += 5
    assert scrape(col)["gpuhpc_slurm_job_cpu_used_seconds"][0].value == 200.0
