"""``gpuhpc topology``: topology.conf from an ibnetdiscover dump, synthetic dumps, live view.

stdout carries only the topology.conf (or the dump, or JSON); every warning goes to stderr,
so ``gpuhpc topology from-ibnetdiscover fabric.out > topology.conf`` is safe in scripts.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from gpuhpc.cli.main import help_for


def _read_input(path: str) -> tuple[str, str]:
    from gpuhpc.errors import UserInputError

    if path == "-":
        data, source = sys.stdin.buffer.read(), "<stdin>"
    else:
        p = Path(path)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise UserInputError(f"no such file: {path}", field="FILE") from None
        except IsADirectoryError:
            raise UserInputError(f"is a directory: {path}", field="FILE") from None
        source = path
    try:
        return data.decode("utf-8"), source
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise UserInputError("not text (invalid UTF-8): not ibnetdiscover output", field=f"{source}:{line}") from None


def write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder + rename."""
    from gpuhpc.fsutil import write_atomic as _write

    _write(path, text, 0o644)          # Slurm's config: slurmctld reads it as SlurmUser


def _warn_all(warnings: list[str]) -> None:
    if not warnings:
        return
    from rich.markup import escape

    from gpuhpc.cli._console import warn

    for w in warnings:
        warn(escape(w))


@click.group("topology", help=help_for("topology"), no_args_is_help=True)
def topology() -> None:
    pass



_OUTPUT = click.option("-o", "--output", help="Write here (atomically) instead of stdout.")


@topology.command("from-ibnetdiscover")
@click.argument("file", metavar="FILE|-")
@click.option("--format", "fmt", default="tree", show_default=True,
              help="tree (topology/tree), block (topology/block), or spec (YAML for the cluster spec's topology:).")
@click.option("--rail", default="auto", show_default=True,
              help="auto (the best compute rail), all, or HCA names: mlx5_0,HCA-1")
@click.option("--spec", help="Cluster spec YAML (as conf validate accepts it): keep only its nodes, warn on "
                             "differences; NVLink domains for --block-by nvlink.")
@click.option("--block-by", default="leaf", show_default=True, help="block format: group by leaf or nvlink (domain).")
@click.option("--block-size", type=int, help="block format: nodes per block (base block size).")
@click.option("--cliques", help="'HOST CLIQUE-ID' lines (NVLink domains) for --block-by nvlink.")
@_OUTPUT
@click.option("--json", "as_json", is_flag=True, help="Print rails, switches, placement and warnings as JSON.")
def from_ibnetdiscover(file: str, fmt: str, rail: str, spec: str | None, block_by: str, block_size: int | None,
                       cliques: str | None, output: str | None, as_json: bool) -> None:
    """Write topology.conf from an ibnetdiscover dump (FILE, '-' = stdin)."""
    from gpuhpc.topology import topology_from_ibnetdiscover
    from gpuhpc.topology import spec as topo_spec

    nodes = topo_spec.load(spec) if spec else None       # the validated cluster spec (exit 2 if not)
    text, source = _read_input(file)
    domains: dict[str, str] = {}
    if nodes and block_by == "nvlink":
        domains.update(nodes.domains)
    if cliques:
        domains.update(topo_spec.read_cliques(cliques))
    res = topology_from_ibnetdiscover(text, source=source, rail=rail, spec_hosts=nodes.hosts if nodes else None,
                                      fmt=fmt, block_by=block_by, block_size=block_size, domains=domains,
                                      compute_hcas=nodes.hcas if nodes else None)
    _warn_all(res.warnings)
    if output:
        write_atomic(output, res.text)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(res.summary())
    elif not output:
        sys.stdout.write(res.text)

@topology.command("synth")
@click.option("--levels", type=int, default=2, show_default=True, help="2 (leaf/spine) or 3 (leaf/spine/core).")
@click.option("--leaves", type=int, default=4, show_default=True, help="Leaf switches per rail.")
@click.option("--hosts-per-leaf", type=int, default=4, show_default=True)
@click.option("--rails", type=int, default=1, show_default=True,
              help="HCAs per host, one plane each (mlx5_0, mlx5_1, ..).")
@click.option("--spines", type=int, help="Spines (per pod with --levels 3).")
@click.option("--leaves-per-pod", type=int, default=8, show_default=True, help="--levels 3: leaves per pod.")
@click.option("--prefix", default="gpu", show_default=True, help="Host name prefix (gpu001, gpu002 ..).")
@click.option("--hosts", help="Host names instead (hostlist), leaf by leaf.")
@click.option("--degraded", type=int, default=0, show_default=True,
              help="Make this many host links 2x (to demo warnings).")
@_OUTPUT
def synth_cmd(levels: int, leaves: int, hosts_per_leaf: int, rails: int, spines: int | None, leaves_per_pod: int,
              prefix: str, hosts: str | None, degraded: int, output: str | None) -> None:
    """Write a synthetic ibnetdiscover dump (same format as the real tool)."""
    from gpuhpc.hostlist import expand
    from gpuhpc.topology.synth import synth

    names = expand(hosts) if hosts else None
    text = synth(levels=levels, leaves=leaves, hosts_per_leaf=hosts_per_leaf, rails=rails, spines=spines,
                 leaves_per_pod=leaves_per_pod, host_prefix=prefix, hosts=names, degraded=degraded)
    if output:
        write_atomic(output, text)
    else:
        sys.stdout.write(text)

@topology.command("show")
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def show(as_json: bool) -> None:
    """The topology Slurm has loaded (scontrol show topology)."""
    from gpuhpc.slurm import SlurmClient

    recs = SlurmClient().topology()
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(recs)
        return
    for r in recs:
        sys.stdout.write(" ".join(f"{k}={v}" for k, v in r.items()) + "\n")


@topology.command("audit")
@click.argument("file", metavar="FABRIC|-")
@click.option("--json", "as_json", is_flag=True, help="Findings as JSON (kind, message, ports, line).")
@click.option("--check", is_flag=True, help="Exit 1 when there is any finding (for CI / cron).")
def audit_cmd(file: str, as_json: bool, check: bool) -> int:
    """Cabling faults of an ibnetdiscover dump: degraded links, HCAs against the rail pattern,
    missing or duplicated links, each with its ports."""
    from gpuhpc.topology.audit import audit
    from gpuhpc.topology.fabric import analyse
    from gpuhpc.topology.ibnetdiscover import parse

    text, source = _read_input(file)
    findings = audit(analyse(parse(text, source)))
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json([f.to_dict() for f in findings])
    else:
        for f in findings:
            sys.stdout.write(f"{f.kind:<10} {f.message}\n")
    from collections import Counter

    counts = Counter(f.kind for f in findings)
    sys.stderr.write(f"{len(findings)} finding(s)" + (": " + ", ".join(f"{n} {k}" for k, n in counts.items())
                                                      if counts else "") + "\n")
    return 1 if check and findings else 0
