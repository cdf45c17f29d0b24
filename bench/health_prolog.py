#!/usr/bin/env python3
"""Benchmark: the health prolog's overhead per job start.

Runs what Slurm's Prolog would run, ``python -m gpuhpc.health --mode prolog`` (GPU device
files vs gres.conf, mounts, scratch, munge round trip; ``SLURMD_NODENAME`` set), N times as a
fresh process, and prints p50/p99 against two baselines measured in the same run: a bare
``python -c pass`` (the interpreter's start) and ``munge -n | unmunge`` (the one external
round trip the prolog makes). Goal: p99 < 1 s.

    .venv/bin/python bench/health_prolog.py [--runs 100] [--node gpu-node1]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _times(argv: list[str], runs: int, env: dict[str, str], *, shell: bool = False) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv if not shell else argv[0], shell=shell, env=env, capture_output=True)
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed: {proc.stdout.decode()} {proc.stderr.decode()}")
    return out


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--node", default="gpu-node1")
    args = ap.parse_args()
    env = {**os.environ, "SLURMD_NODENAME": args.node}
    py = sys.executable
    rows = [
        ("python -c pass", _times([py, "-c", "pass"], args.runs, env)),
        ("munge -n | unmunge", _times(["munge -n | unmunge >/dev/null"], args.runs, env, shell=True)),
        ("gpuhpc prolog", _times([py, "-m", "gpuhpc.health", "--mode", "prolog"], args.runs, env)),
    ]
    base = statistics.median(rows[0][1])
    print(f"{'command':22} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'p50 / python':>13}")
    for name, xs in rows:
        print(f"{name:22} {statistics.median(xs) * 1e3:8.1f} {_pct(xs, 99) * 1e3:8.1f} {max(xs) * 1e3:8.1f} "
              f"{statistics.median(xs) / base:13.2f}")
    p99 = _pct(rows[-1][1], 99)
    print(f"prolog p99 {p99 * 1e3:.0f} ms over {args.runs} runs on {args.node}: goal < 1000 ms "
          f"{'met' if p99 < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
