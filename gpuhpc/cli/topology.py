"""``gpuhpc topology``: topology.conf from an ibnetdiscover dump, synthetic dumps, live view.

stdout carries only the topology.conf (or the dump, or JSON); every warning goes to stderr,
so ``gpuhpc topology from-ibnetdiscover fabric.out > topology.conf`` is safe in scripts.
"""
from __future__ import annotations

import sys
from pathlib import Path

import typer


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

    _write(path, text)


def _warn_all(warnings: list[str]) -> None:
    if not warnings:
        return
    from rich.markup import escape

    from gpuhpc.cli._console import warn

    for w in warnings:
        warn(escape(w))


def register(app: typer.Typer) -> None:
    topo = typer.Typer(help="Fabric topology: topology.conf from ibnetdiscover, synthetic fabrics.",
                       no_args_is_help=True)
    app.add_typer(topo, name="topology")

    @topo.command("from-ibnetdiscover")
    def from_ibnetdiscover(
        file: str = typer.Argument(..., metavar="FILE|-", help="ibnetdiscover output ('-' = stdin)."),
        fmt: str = typer.Option("tree", "--format", help="tree (topology/tree), block (topology/block), or spec (YAML for the cluster spec's topology:)."),
        rail: str = typer.Option("auto", "--rail",
                                 help="auto (the best compute rail), all, or HCA names: mlx5_0,HCA-1"),
        spec: str | None = typer.Option(None, "--spec", help="Cluster spec YAML (as conf validate accepts it): keep only its nodes, warn on differences; NVLink domains for --block-by nvlink."),
        block_by: str = typer.Option("leaf", "--block-by", help="block format: group by leaf or nvlink (domain)."),
        block_size: int | None = typer.Option(None, "--block-size", help="block format: nodes per block (base block size)."),
        cliques: str | None = typer.Option(None, "--cliques", help="'HOST CLIQUE-ID' lines (NVLink domains) for --block-by nvlink."),
        output: str | None = typer.Option(None, "-o", "--output", help="Write here (atomically) instead of stdout."),
        as_json: bool = typer.Option(False, "--json", help="Print rails, switches, placement and warnings as JSON."),
    ) -> None:
        """Write topology.conf from an ibnetdiscover dump."""
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

    @topo.command("synth")
    def synth_cmd(
        levels: int = typer.Option(2, "--levels", help="2 (leaf/spine) or 3 (leaf/spine/core)."),
        leaves: int = typer.Option(4, "--leaves", help="Leaf switches per rail."),
        hosts_per_leaf: int = typer.Option(4, "--hosts-per-leaf"),
        rails: int = typer.Option(1, "--rails", help="HCAs per host, one plane each (mlx5_0, mlx5_1, ..)."),
        spines: int | None = typer.Option(None, "--spines", help="Spines (per pod with --levels 3)."),
        leaves_per_pod: int = typer.Option(8, "--leaves-per-pod", help="--levels 3: leaves per pod."),
        prefix: str = typer.Option("gpu", "--prefix", help="Host name prefix (gpu001, gpu002 ..)."),
        hosts: str | None = typer.Option(None, "--hosts", help="Host names instead (hostlist), leaf by leaf."),
        degraded: int = typer.Option(0, "--degraded", help="Make this many host links 2x (to demo warnings)."),
        output: str | None = typer.Option(None, "-o", "--output", help="Write here (atomically) instead of stdout."),
    ) -> None:
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

    @topo.command("show")
    def show(as_json: bool = typer.Option(False, "--json", help="JSON output.")) -> None:
        """The topology Slurm has loaded (scontrol show topology)."""
        from gpuhpc.slurm import SlurmClient

        recs = SlurmClient().topology()
        if as_json:
            from gpuhpc.cli._console import print_json

            print_json(recs)
            return
        for r in recs:
            sys.stdout.write(" ".join(f"{k}={v}" for k, v in r.items()) + "\n")
