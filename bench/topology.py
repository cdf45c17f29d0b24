#!/usr/bin/env python3
"""Benchmark: topology.conf generation from ibnetdiscover dumps.

Measures, on the real NDR multi-rail dump and on a synthetic 10,000-host 3-level fat tree:
parse + analyse + tree + write (best of N), peak Python memory (tracemalloc), and the ratio
against a baseline measured in the same run: reading the same text and counting its lines
(the least any parser must do). Goal: < 2 s for the 10,000-host fabric.

    .venv/bin/python bench/topology.py [--repeat 5] [--hosts 10000]
"""
from __future__ import annotations

import argparse
import gc
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuhpc.topology import topology_from_ibnetdiscover  # noqa: E402
from gpuhpc.topology.synth import synth  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def peak_mib(fn) -> float:
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def bench(label: str, path: Path, repeat: int) -> None:
    size = path.stat().st_size

    def baseline():
        with open(path) as fh:
            return len(fh.read().splitlines())

    def ours():
        res = topology_from_ibnetdiscover(path.read_text(), source=str(path))
        return res.text

    nlines = baseline()
    conf = ours()
    t_base = best(baseline, repeat)
    t_ours = best(ours, repeat)
    mem = peak_mib(ours)
    print(f"{label}: {size / 2**20:.2f} MiB, {nlines} lines -> {conf.count('SwitchName=')} switches in topology.conf")
    print(f"  gpuhpc (parse+analyse+write) {t_ours * 1000:9.1f} ms   peak {mem:7.1f} MiB (tracemalloc)")
    print(f"  baseline (read + count lines) {t_base * 1000:8.1f} ms   ratio {t_ours / t_base:7.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--hosts", type=int, default=10000)
    ap.add_argument("--real", default=str(REPO / "tests" / "fixtures" / "ibnetdiscover" / "ndr-dgx-multirail.out"))
    args = ap.parse_args()
    real = Path(args.real)
    if real.exists():
        bench("real NDR multi-rail dump", real, args.repeat)
    else:
        print(f"real dump not found at {real} (--real FILE); skipped")
    hosts_per_leaf = 20
    leaves = -(-args.hosts // hosts_per_leaf)
    t0 = time.perf_counter()
    text = synth(levels=3, leaves=leaves, hosts_per_leaf=hosts_per_leaf, leaves_per_pod=16, spines=8, cores=16)
    t_gen = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "synth.out"
        p.write_text(text)
        print(f"synthetic 3-level fat tree: {leaves * hosts_per_leaf} hosts, {leaves} leaves "
              f"(generated in {t_gen * 1000:.0f} ms)")
        bench("  synthetic dump", p, max(1, args.repeat // 2))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpuhpc", "topology", "from-ibnetdiscover", str(p)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
        t_cli = time.perf_counter() - t0
        print(f"  CLI end to end (python -m gpuhpc, incl. start-up) {t_cli * 1000:.0f} ms "
              f"({'under' if t_cli < 2 else 'OVER'} the 2 s goal)")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max RSS of this benchmark process: {rss:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
