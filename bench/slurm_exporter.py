#!/usr/bin/env python3
"""Benchmark: what the Slurm exporter costs Slurm and itself at 500 nodes and 5,000 jobs (issue 35.3),
the per-scrape path it had (every scrape: ``scontrol show node``, ``squeue``, then ``sstat
--allsteps`` for every running job, 200 ids a call) against the cached collector (one look at the
cluster per TTL, sstat in the background at most once per usage interval), in the same run.

Slurm is faked: its output for 500 nodes (8 H100 each, 4,000 jobs running across them, 1,000
pending) is generated once in the formats gpuhpc asks for, and every "command" is answered with it
and fed through gpuhpc's own parsers (``parse_nodes``, ``parse_squeue`` with the row tag,
``parse_sstat``) and the exporter's ``samples``: the CPU cost is gpuhpc's real parsing work; the
Slurm side is counted, not timed (slurmctld RPCs, and the slurmds an sstat call contacts: every node
running a step of the jobs it names).

An hour is simulated: an HA pair of Prometheus servers scraping every ``--interval`` s (30, the
monitoring role's default), a scrape of the pair 0.2 s apart. The old path serves every scrape;
the new one serves them from its TTL cache (``--ttl``) and refreshes sstat every
``--usage-interval`` s. Prints the figures and the old/new ratios; asserts nothing.

    .venv/bin/python bench/slurm_exporter.py [--nodes 500] [--jobs 5000] [--interval 30] [--minutes 10]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuhpc.monitoring.slurm_exporter import SlurmCollector, samples  # noqa: E402
from gpuhpc.slurm.commands import SEP, SQUEUE_FIELDS  # noqa: E402
from gpuhpc.slurm.parsers import parse_nodes, parse_squeue  # noqa: E402
from gpuhpc.slurm.usage import job_usage  # noqa: E402
from gpuhpc.transport import CommandResult  # noqa: E402

TAG = "\x1egpuhpcRow"


def fake_slurm(nodes: int, jobs: int) -> tuple[str, list[tuple[str, str, str]], dict[str, str]]:
    """(scontrol show node text, squeue rows (job id, state, node), {job id: its sstat lines})."""
    node_lines = []
    running = int(jobs * 0.8)
    per_node = max(1, running // nodes)
    for n in range(nodes):
        alloc = min(8, per_node)
        node_lines.append(f"NodeName=gpu{n:04d} Arch=x86_64 CoresPerSocket=56 CPUAlloc={alloc * 8} CPUTot=224 "
                          f"Gres=gpu:h100:8(S:0-1) State={'MIXED' if alloc < 8 else 'ALLOCATED'} "
                          f"Partitions=gpu,all RealMemory=2000000 AllocMem={alloc * 100000} "
                          f"AllocTRES=cpu={alloc * 8},mem={alloc * 100000}M,gres/gpu={alloc},gres/gpu:h100={alloc}")
    rows, sstat = [], {}
    for j in range(jobs):
        jid = str(100000 + j)
        if j < running:
            node = f"gpu{j % nodes:04d}"
            rows.append((jid, "RUNNING", node))
            sstat[jid] = (f"{jid}.batch|00:{j % 60:02d}:10|1|{1 + j % 7}G\n"
                          f"{jid}.0|01:{j % 60:02d}:00|8|{20 + j % 13}G\n")
        else:
            rows.append((jid, "PENDING", ""))
    return "\n".join(node_lines) + "\n", rows, sstat


def squeue_text(rows) -> str:
    out = []
    for jid, state, node in rows:
        vals = {"job_id": jid, "job_id_raw": jid, "array_job_id": jid, "array_task_id": "N/A", "state": state,
                "elapsed": "1:00:00" if state == "RUNNING" else "0:00", "time_limit": "1-00:00:00",
                "nodes": "1", "tres_per_node": "gres:gpu:h100:1", "partition": "gpu", "user": f"u{int(jid) % 97}",
                "account": f"acct{int(jid) % 13}", "nodelist": node, "reason": "None" if node else "Priority",
                "qos": "normal", "name": f"trial-{jid}"}
        out.append(TAG + SEP.join(vals[k] for k, _ in SQUEUE_FIELDS))
    return "\n".join(out) + "\n"


class FakeSlurm:
    """A SlurmClient's reads the exporter uses, answered from the fake output through gpuhpc's parsers;
    counts slurmctld RPCs and slurmd contacts."""

    def __init__(self, nodes_text: str, rows, sstat: dict[str, str]) -> None:
        self.nodes_text, self.queue_text, self.sstat = nodes_text, squeue_text(rows), sstat
        self.node_of = {jid: node for jid, _, node in rows if node}
        self.ctld = 0               # slurmctld RPCs (scontrol, squeue, and each sstat's job lookup)
        self.slurmd = 0             # slurmds sstat asked
        self.commands = 0

    def nodes(self):
        self.ctld += 1
        self.commands += 1
        return parse_nodes(self.nodes_text)

    def queue(self):
        self.ctld += 1
        self.commands += 1
        return parse_squeue(self.queue_text, row_tag=TAG)

    def run(self, argv, **kw):      # sstat --jobs=a,b,c
        ids = next(a for a in argv if a.startswith("--jobs=")).split("=", 1)[1].split(",")
        self.commands += 1
        self.ctld += 1
        self.slurmd += len({self.node_of[j] for j in ids if j in self.node_of})
        return CommandResult(tuple(argv), 0, "".join(self.sstat.get(j, "") for j in ids), "")


def old_scrape(slurm: FakeSlurm) -> int:
    """The per-scrape path: nodes, queue, sstat for every running job, the samples."""
    queue = slurm.queue()
    running = [r.job_id for r in queue if r.state.raw.startswith("RUNNING") and "_" not in r.job_id]
    return len(samples(slurm.nodes(), queue, job_usage(slurm, running)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=5000)
    ap.add_argument("--interval", type=float, default=30.0, help="Prometheus' scrape interval, s")
    ap.add_argument("--ttl", type=float, default=4.0)
    ap.add_argument("--usage-interval", type=float, default=30.0)
    ap.add_argument("--minutes", type=float, default=10.0, help="simulated time (figures scaled to an hour)")
    args = ap.parse_args(argv)

    nodes_text, rows, sstat = fake_slurm(args.nodes, args.jobs)
    scrapes = int(args.minutes * 60 / args.interval)
    scale = 60 / args.minutes

    old = FakeSlurm(nodes_text, rows, sstat)
    t0 = time.process_time()
    lat_old = []
    for _ in range(scrapes * 2):                 # the HA pair: every scrape served in full
        t = time.perf_counter()
        n_old = old_scrape(old)
        lat_old.append(time.perf_counter() - t)
    cpu_old = time.process_time() - t0

    new = FakeSlurm(nodes_text, rows, sstat)
    clock = [0.0]
    col = SlurmCollector(new, ttl=args.ttl, usage_interval=args.usage_interval, background=False,
                         clock=lambda: clock[0])
    in_refresh = [0.0]
    refresh = col.refresh_usage

    def timed_refresh() -> None:                 # the background thread's work (run inline here)
        t = time.perf_counter()
        refresh()
        in_refresh[0] += time.perf_counter() - t

    col.refresh_usage = timed_refresh
    t0 = time.process_time()
    lat_new, n_new = [], 0
    for i in range(scrapes):
        for offset in (0.0, 0.2):                # the pair, 0.2 s apart
            clock[0] = i * args.interval + offset
            in_refresh[0] = 0.0
            t = time.perf_counter()
            n_new = len(list(col.collect()))
            lat_new.append(time.perf_counter() - t - in_refresh[0])     # what the scrape waited for
    cpu_new = time.process_time() - t0
    fam_samples = len(samples(*col.look(), col.usage))

    def per_hour(x: float) -> str:
        return f"{x * scale:,.0f}"

    lat_old.sort(), lat_new.sort()
    print(f"Slurm exporter at {args.nodes} nodes, {args.jobs} jobs ({sum(1 for r in rows if r[1] == 'RUNNING')} "
          f"running), an HA pair scraping every {args.interval:g} s; {args.minutes:g} simulated minutes scaled "
          "to an hour")
    print(f"{'':40}{'per-scrape path':>18}{'cached collector':>18}{'ratio':>9}")
    for what, a, b in (("slurmctld RPCs per hour", old.ctld, new.ctld),
                       ("slurmd contacts (sstat) per hour", old.slurmd, new.slurmd),
                       ("Slurm commands per hour", old.commands, new.commands),
                       ("gpuhpc CPU seconds per hour", cpu_old, cpu_new)):
        ratio = f"{a / b:.1f}x" if b else "inf"
        print(f"{what:40}{per_hour(a) if 'CPU' not in what else f'{a * scale:.1f}':>18}"
              f"{per_hour(b) if 'CPU' not in what else f'{b * scale:.1f}':>18}{ratio:>9}")
    med_old, med_new = lat_old[len(lat_old) // 2], lat_new[len(lat_new) // 2]
    print(f"{'median scrape wait, gpuhpc work (ms)':40}{med_old * 1000:>18.1f}{med_new * 1000:>18.1f}"
          f"{med_old / med_new if med_new else float('inf'):>8.1f}x")
    print(f"samples per scrape: {n_old:,} (per-scrape path), {fam_samples:,} (cached); families {n_new}")
    print("The per-scrape path also waits, on every scrape, for sstat's round trips to the slurmds above;"
          " the cached collector's scrape never does (sstat runs in a thread).")
    from gpuhpc.monitoring.efficiency import MAX_SAMPLES, long_range_samples

    gpus = args.nodes * 8
    print(f"\n`report efficiency --account A --period month` at {gpus:,} GPUs (Prometheus' query.max-samples "
          f"{MAX_SAMPLES / 1e6:.0f}M): per-GPU series at 15 s {long_range_samples(gpus, 30 * 86400, 15) / 1e6:,.0f}M "
          f"samples; the recording rule gpuhpc:job_idle_gpu_samples:sum5m at most {gpus * 30 * 86400 / 300 / 1e6:.1f}M "
          "(one sample per job per 5 minutes, one job per GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
