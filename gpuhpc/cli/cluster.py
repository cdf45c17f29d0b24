"""``gpuhpc cluster ...``: what the cluster looks like right now."""
from __future__ import annotations

import click

from gpuhpc.cli._console import console, print_json
from gpuhpc.cli.main import help_for
from gpuhpc.errors import GpuhpcError


@click.group("cluster", help=help_for("cluster"), no_args_is_help=True)
def cluster() -> None:
    pass


def node_list(text: str) -> str:
    """A partition's nodes as compressed hostlist terms, ``", "``-separated so that a table
    wraps between them (``gpu-node[1-2], cpu-node1``); Slurm reads blanks as separators too."""
    from gpuhpc import hostlist

    if not text or text == "(null)":
        return ""
    try:
        return ", ".join(hostlist.compress_terms(hostlist.expand(text)))
    except GpuhpcError:
        return text


def _state_style(state: str) -> str:
    s = state.upper()
    if s.startswith(("IDLE",)):
        return "green"
    if s.startswith(("MIX", "ALLOC", "COMPLETING")):
        return "yellow"
    return "red"


def preempt_signal_warning(config: dict[str, str]) -> str | None:
    """Why preempted jobs would lose their checkpoint (issue 15), from ``scontrol show config``:
    without ``preempt_send_user_signal`` a preemption sends SIGTERM, not the job's SIGUSR2, and
    srun answers SIGTERM by killing its tasks at once."""
    if config.get("PreemptType", "preempt/none") in ("preempt/none", "(null)", ""):
        return None           # (partitions and QOS may preempt even when the global PreemptMode is OFF)
    params = [p.strip() for p in config.get("SlurmctldParameters", "").split(",")]
    if "preempt_send_user_signal" in params:
        return None
    return ("SlurmctldParameters lacks preempt_send_user_signal: a preempted job gets SIGTERM instead "
            "of its warning signal (SIGUSR2), and srun kills multi-node jobs' tasks at once; they lose "
            "everything since their last periodic checkpoint (docs/jobs.md)")


@cluster.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def status(as_json: bool) -> None:
    """Nodes with state; GPUs total/allocated/free by type and MIG type; partitions."""
    from gpuhpc.cli._console import warn
    from gpuhpc.cluster import cluster_status
    from gpuhpc.slurm.client import SlurmClient

    st = cluster_status()
    try:
        message = preempt_signal_warning(SlurmClient().config())
    except GpuhpcError:
        message = None
    if message:
        warn(message)
    if as_json:
        print_json(st.to_dict())
        return
    from rich.table import Table

    out = console()
    nodes = Table(title="Nodes", title_justify="left", show_edge=False)
    for col in ("node", "state", "cpus (alloc/total)", "memory MB", "GPUs (free/total)", "partitions"):
        nodes.add_column(col, overflow="fold")
    for n in st.nodes:
        gpus = ", ".join(f"{t} {n.gpus_free[t]}/{c}" for t, c in sorted(n.gpus_total.items())) or "-"
        style = _state_style(n.state)
        nodes.add_row(n.name, f"[{style}]{n.state.lower()}[/]", f"{n.cpus_alloc}/{n.cpus}",
                      str(n.real_memory_mb), gpus, ", ".join(n.partitions))
    out.print(nodes)

    gpus = Table(title="GPUs by type", title_justify="left", show_edge=False)
    for col in ("type", "kind", "total", "allocated", "free"):
        gpus.add_column(col, justify="right" if col in ("total", "allocated", "free") else "left")
    for g in st.gpus:
        gpus.add_row(g.gpu_type, "MIG" if g.mig else "GPU", str(g.total), str(g.allocated), str(g.free))
    out.print(gpus)

    parts = Table(title="Partitions", title_justify="left", show_edge=False)
    lists = [node_list(p.nodes) for p in st.partitions]
    # a node list wraps between its hostlist terms, never inside one
    term = max((len(t) + 1 for text in lists for t in text.split(", ")), default=5)
    for col in ("partition", "state", "nodes", "priority", "preempt", "max time", "default"):
        parts.add_column(col, overflow="fold", min_width=term if col == "nodes" else None)
    for p, nodelist in zip(st.partitions, lists):
        parts.add_row(p.name, p.state.lower(), nodelist, str(p.priority_tier), p.preempt_mode,
                      p.max_time, "yes" if p.default else "")
    out.print(parts)


@cluster.command("trust")
@click.argument("name")
@click.option("--yes", "-y", is_flag=True, help="trust the key without asking")
@click.option("--fingerprint", "expect", metavar="SHA256:...",
              help="trust only a key with this fingerprint (from the cluster's admins)")
def trust(name: str, yes: bool, expect: str | None) -> None:
    """Show a cluster's SSH host key fingerprint and add the key to known_hosts. NAME: a cluster
    profile name, or [user@]host[:port]."""
    import sys

    from gpuhpc.errors import TransportError, UserInputError
    from gpuhpc.transport.ssh import fingerprint, runner_for, scan_host_key
    from gpuhpc.transport.ssh import trust as add_key

    runner = runner_for(name)
    key = scan_host_key(runner)
    fp = fingerprint(key)
    click.echo(f"{runner.host}:{runner.port} host key: {key.get_name()} {fp}", err=True)
    if expect:
        if expect.strip() != fp:
            raise TransportError(f"the host key's fingerprint is {fp}, not {expect.strip()}: not trusted",
                                 hint="do not connect; ask the cluster's admins")
    elif not yes:
        if not sys.stdin.isatty():
            raise UserInputError("not trusting a host key without confirmation", field="--yes",
                                 hint="compare the fingerprint above with the admins', then pass --yes "
                                      "or --fingerprint SHA256:...")
        click.confirm("Is this the cluster's key (compare with what its admins publish)?", abort=True)
    path, added = add_key(runner, key)
    click.echo(f"{'added to' if added else 'already in'} {path}", err=True)

