"""``gpuhpc node``: what a GPU node has, as gres.conf lines and a sizing report."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.main import help_for


@click.group("node", help=help_for("node"), no_args_is_help=True)
def node_group() -> None:
    pass



_JSON = click.option("--json", "as_json", is_flag=True, help="JSON output.")


@node_group.command("inventory")
@click.option("--smi-xml", help="nvidia-smi -q -x output (or -q text).")
@click.option("--topo", help="nvidia-smi topo -m output.")
@click.option("--list", "listing", help="nvidia-smi -L output.")
@click.option("--mig-lgi", help="nvidia-smi mig -lgi output.")
@click.option("--mig-lgip", help="nvidia-smi mig -lgip output.")
@click.option("--node", help="Prefix lines with NodeName= (live: this host).")
@click.option("--cpus", type=int, help="vCPUs of the node (live: this host's).")
@click.option("--type", "gpu_type", help="Force the GPU Type= name.")
@click.option("--type-style", default="short", show_default=True,
              help="short (h100, 1g.10gb) or slurm (nvidia_h100_80gb_hbm3, as AutoDetect=nvml names them).")
@click.option("--gres-only", is_flag=True, help="Only the gres.conf lines, no report comments.")
@_JSON
def inventory(smi_xml: str | None, topo: str | None, listing: str | None, mig_lgi: str | None, mig_lgip: str | None,
              node: str | None, cpus: int | None, gpu_type: str | None, type_style: str, gres_only: bool,
              as_json: bool) -> None:
    """gres.conf lines + node-sizing report, from nvidia-smi captures or live nvidia-smi."""
    from gpuhpc.inventory import collect

    files = {"xml": (smi_xml, "--smi-xml"), "topo": (topo, "--topo"), "list": (listing, "--list"),
             "lgi": (mig_lgi, "--mig-lgi"), "lgip": (mig_lgip, "--mig-lgip")}
    if any(path for path, _ in files.values()):
        texts = {kind: (_read(path, opt), path) for kind, (path, opt) in files.items() if path}
    else:
        runner = _runner()
        texts = _live(runner)
        if node is None:
            node = _node_name(runner)
        if cpus is None:
            cpus = int(_run(runner, ("getconf", "_NPROCESSORS_ONLN")).strip())
    inv = collect(texts, node=node, cpus=cpus, type_style=type_style, type_override=gpu_type)
    if inv.warnings:
        from rich.markup import escape

        from gpuhpc.cli._console import warn

        for w in inv.warnings:
            warn(escape(w))
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(inv.to_dict())
        return
    out = list(inv.gres_lines)
    if not gres_only:
        r = inv.report
        out.append(f"# slurm.conf: {'NodeName=' + node + ' ' if node else ''}Gres={inv.node_gres}")
        out.append(f"# sizing: {r['gpus']} GPUs, vCPUs {r['vcpus'] if r['vcpus'] is not None else '?'}"
                   f"{' (inferred)' if r['vcpus_inferred'] else ''}, per GPU "
                   f"{r['vcpus_per_gpu'] if r['vcpus_per_gpu'] is not None else '?'}")
        if r["gpus_per_numa"]:
            out.append("# GPUs per NUMA node: " + ", ".join(f"{k}: {v}" for k, v in r["gpus_per_numa"].items()))
        for g, nics in r["gpudirect_nics"].items():
            out.append(f"# GPUDirect {g}: {', '.join(nics) if nics else 'no NIC under its PCIe switch'}")
        out.extend(f"# note: {n}" for n in inv.notes)
        out.extend(f"# warning: {w}" for w in inv.warnings)
    sys.stdout.write("\n".join(out) + "\n")

@node_group.command("clique")
@click.option("--smi-xml", help="nvidia-smi -q -x output (default: run it).")
@click.option("--node", help="Host name to print (default: this host).")
def clique_cmd(smi_xml: str | None, node: str | None) -> None:
    """Print 'HOST CLUSTERUUID.CLIQUEID' (the node's NVLink domain) for
    `gpuhpc topology from-ibnetdiscover --format block --block-by nvlink --cliques FILE`."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.inventory import LIVE_COMMANDS, clique

    runner = None
    if smi_xml:
        text, source = _read(smi_xml, "--smi-xml"), smi_xml
    else:
        runner = _runner()
        argv = dict(LIVE_COMMANDS)["xml"]
        text, source = _run(runner, argv), " ".join(argv)
    cid = clique(text, source)
    if cid is None:
        raise UserInputError("the driver reports no NVLink clique for these GPUs (not an NVL/GB200 system, "
                             "or fabric manager not running)", field="--smi-xml" if smi_xml else None)
    sys.stdout.write(f"{node or _node_name(runner or _runner())} {cid}\n")

@node_group.command("health")
@click.argument("node", metavar="[NODE]", required=False)
@click.option("--mode", default="full", show_default=True,
              help="full, or prolog (the fast subset Slurm's Prolog runs).")
@click.option("--deep", is_flag=True, help="The deep checks instead: DCGM diagnostics (dcgmi diag) and "
              "nccl all-reduce bandwidth against the node's baseline in the ledger database "
              "(the first passing run sets it). Minutes; run it on an idle node.")
@click.option("--apply", is_flag=True, help="Drain a failing node (gpuhpc:<hw|dev|sw|perf>: reason); "
              "resume it once healthy if these checks drained it, except a hardware (hw) drain, which "
              "an admin or a passing deep check returns (docs/health.md).")
@click.option("--spec", help="Health spec YAML (default $GPUHPC_HEALTH_SPEC).")
@_JSON
def health_cmd(node: str | None, mode: str, deep: bool, apply: bool, spec: str | None, as_json: bool) -> int:
    """Health checks (GPUs vs gres.conf, MIG layout, XID, ECC, clocks, IB, scratch, mounts, munge),
    or with --deep DCGM diagnostics and nccl bandwidth; exit 1 when one fails. NODE: the Slurm
    node name (default: this host's; $SLURMD_NODENAME). Runs where gpuhpc runs commands (this
    host, or GPUHPC_SSH_HOST)."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.health import HealthSpec, check_node
    from gpuhpc.health.spec import load

    if mode not in ("full", "prolog"):
        raise UserInputError(f"unknown mode {mode!r}", field="--mode", hint="full or prolog")
    from gpuhpc.config import getenv

    path = spec or getenv("GPUHPC_HEALTH_SPEC")
    hspec = load(_read(path, "--spec"), path) if path else HealthSpec()
    runner = _runner()
    name = node or runner.getenv("SLURMD_NODENAME") or _node_name(runner)
    baselines = None
    if deep:
        from gpuhpc.health.deep import Baselines
        from gpuhpc.ledger.hooks import ledger_in_use

        mode = "deep"
        url = ledger_in_use()
        baselines = Baselines(url) if url else None
    out = check_node(name, runner=runner, spec=hspec, mode=mode, apply=apply, baselines=baselines)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json(out.to_dict())
    else:
        lines = [f"{r.status.value:4}  {r.check:12} {r.message}" for r in out.report.results]
        if out.decision is None:
            lines.append(f"note: Slurm does not know a node {name!r}: nothing drained or resumed")
        else:
            d = out.decision
            verb = {"none": "no change", "drain": "drain", "resume": "resume"}[d.action.value]
            done = " (done)" if out.applied else (" (pass --apply to do it)" if d.action.value != "none" else "")
            lines.append(f"{name}: {verb}{done}: {d.reason or d.why}")
        sys.stdout.write("\n".join(lines) + "\n")
    if not out.report.healthy:
        return 1
    return 0


@node_group.command("baseline")
@click.argument("node", metavar="NODE")
@click.option("--nccl", type=float, help="Set the all-reduce bus bandwidth baseline, GB/s "
              "(an admin's value: measurements never overwrite it).")
@_JSON
def baseline_cmd(node: str, nccl: float | None, as_json: bool) -> None:
    """The Slurm node NODE's deep-check baseline (nccl all-reduce bus bandwidth) in the ledger database:
    show it, or set it with --nccl."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.health.deep import Baselines

    if nccl is not None and not 0 < nccl < 100000:
        raise UserInputError("must be a bandwidth in GB/s", field="--nccl")
    b = Baselines()
    if nccl is not None:
        b.record(node, nccl, "admin")
    value = b.get(node)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"node": node, "nccl_allreduce_busbw": value})
    else:
        sys.stdout.write(f"{node}: nccl all-reduce baseline "
                         + (f"{value:g} GB/s\n" if value is not None else "none yet (the first passing "
                            "`gpuhpc node health --deep` sets it)\n"))

@node_group.command("mig-plan")
def mig_plan_cmd() -> None:
    """MIG commands that turn a node's instances into the spec's layout (JSON in on stdin, JSON out).

    Input: {"gpu_type", "layouts": [[profile, ...] per GPU], "lgi": `nvidia-smi mig -lgi` output,
    "modes": `nvidia-smi --query-gpu=index,mig.mode.current --format=csv,noheader` output}.
    Output: {"changed", "commands": [argv, ...], "summary": [line per changed GPU]}. The
    gpuhpc_nvidia_gpu role runs it on the control node."""
    import json

    from gpuhpc.cli._console import print_json
    from gpuhpc.errors import UserInputError
    from gpuhpc.inventory.mig import plan_from_texts

    try:
        doc = json.loads(sys.stdin.read())
        args = (str(doc["gpu_type"]), [list(map(str, x)) for x in doc["layouts"]], str(doc.get("lgi", "")),
                str(doc.get("modes", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserInputError(f"mig-plan input: {exc}", hint='{"gpu_type": "h100", "layouts": [[...]], '
                             '"lgi": "...", "modes": "..."} on stdin') from None
    print_json(plan_from_texts(*args).to_dict())

@node_group.command("mig-gres")
def mig_gres_cmd() -> None:
    """gres.conf rows with a MIG node's slices as the driver numbers them (JSON in on stdin, JSON out).

    Input: {"gres_lines": the template context's, "node": the node's entry of its "nodes", "lgi":
    the node's `nvidia-smi mig -lgi`, "minors": its /proc/driver/nvidia-caps/mig-minors}.
    Output: {"gres_lines": [...]}: that node's MIG rows with File= of the nvidia-caps devices of its
    GPU instances. The gpuhpc_slurm_common role runs it on the control node for each MIG node."""
    import json

    from gpuhpc.cli._console import print_json
    from gpuhpc.errors import UserInputError
    from gpuhpc.inventory.mig import node_gres_lines

    try:
        doc = json.loads(sys.stdin.read())
        args = (list(doc["gres_lines"]), dict(doc["node"]), str(doc.get("lgi", "")), str(doc.get("minors", "")))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserInputError(f"mig-gres input: {exc}", hint='{"gres_lines": [...], "node": {...}, "lgi": "...", '
                             '"minors": "..."} on stdin') from None
    try:
        print_json({"gres_lines": node_gres_lines(*args)})
    except ValueError as exc:
        raise UserInputError(f"node {args[1].get('name')}: {exc}", field="lgi") from None


@node_group.command("reboot")
@click.argument("nodes", metavar="NODES")
@click.option("--batch", type=int, default=1, show_default=True, help="How many nodes reboot at once.")
@click.option("--reason", required=True, help="Why (Slurm shows it as the nodes' Reason while they drain "
              "and reboot), e.g. \"driver 550.90 update\".")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait for each batch to be back in service before the next (--no-wait: ask every "
              "batch at once and return).")
@click.option("--timeout", type=float, default=None,
              help="Seconds a batch may take, from its request (its nodes' running jobs included); "
              "default: as long as Slurm takes (ResumeTimeout marks a node that does not boot DOWN).")
@_JSON
def reboot_cmd(nodes: str, batch: int, reason: str, wait: bool, timeout: float | None, as_json: bool) -> int:
    """Rolling reboot (driver or firmware updates): NODES (a Slurm hostlist, e.g. gpu[01-16]) reboot
    BATCH at a time through Slurm's RebootProgram: each node drains, reboots once its running jobs
    have finished (ASAP) and returns to service when its slurmd registers (nextstate=RESUME). With
    --wait a node that does not come back (DOWN, still drained, or past --timeout) stops the rollout:
    exit 1 naming it, the later batches are not rebooted. Needs Slurm admin rights."""
    from gpuhpc import hostlist
    from gpuhpc.errors import UserInputError
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.slurm.reboot import check_batch, check_reason, read_nodes, rollout

    check_batch(batch)
    reason = check_reason(reason)
    if timeout is not None and timeout <= 0:
        raise UserInputError(f"timeout {timeout:g} is not positive", field="--timeout")
    names = list(dict.fromkeys(hostlist.expand(nodes, field="NODES")))
    if not names:
        raise UserInputError("no nodes given", field="NODES", hint="a Slurm hostlist, e.g. gpu[01-04]")
    client = SlurmClient(_runner())
    known = read_nodes(client)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UserInputError(f"Slurm knows no node {hostlist.compress(unknown)}", field="NODES",
                             hint="a node Slurm knows (sinfo --Node lists them)")
    err = sys.stderr
    out = rollout(client, names, batch=batch, reason=reason, wait=wait, timeout=timeout,
                  report=lambda line: (err.write(line + "\n"), err.flush()))
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"rebooted": out.rebooted, "requested": out.requested, "untouched": out.untouched,
                    "failed": [{"node": n, "why": why} for n, why in out.failed]})
    elif wait:
        sys.stdout.write(f"rebooted and back: {hostlist.compress(out.rebooted) if out.rebooted else 'none'}\n")
    else:
        sys.stdout.write(f"reboot requested: {hostlist.compress(out.requested)}\n")
    if out.failed:
        from gpuhpc.errors import GpuhpcError

        left = f"; not rebooted: {hostlist.compress(out.untouched)}" if out.untouched else ""
        raise GpuhpcError("rollout stopped: " + "; ".join(f"{n} {why}" for n, why in out.failed) + left)
    return 0


def _read(path: str, opt: str) -> str:
    from pathlib import Path

    from gpuhpc.errors import UserInputError

    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        raise UserInputError(f"no such file: {path}", field=opt) from None


def _runner():
    """Where the node's commands run: this host, or the one GPUHPC_SSH_HOST names."""
    from gpuhpc.transport import default_runner

    return default_runner()


def _run(runner, argv: tuple[str, ...], *, required: bool = True) -> str:
    """``argv``'s stdout, run through ``runner`` ('' when it fails and is not ``required``)."""
    from gpuhpc.errors import GpuhpcError, TransportError, UserInputError

    hint = "pass captures instead: --smi-xml F --topo F --list F --mig-lgi F"
    try:
        res = runner.run(list(argv), timeout=60)
    except TransportError as exc:
        if "command not found" in exc.message:
            raise UserInputError(f"{argv[0]} not found where gpuhpc runs commands", hint=hint) from None
        raise
    if res.ok:
        return res.stdout
    if res.returncode == 127:           # the remote shell's "command not found"
        raise UserInputError(f"{argv[0]} not found where gpuhpc runs commands", hint=hint)
    if not required:
        return ""
    raise GpuhpcError(f"{' '.join(argv)} failed (exit {res.returncode}): {res.stderr.strip()[:200]}")


def _live(runner) -> dict[str, tuple[str, str]]:
    """Run nvidia-smi through ``runner``; returns {kind: (text, source)} for gpuhpc.inventory.collect."""
    from gpuhpc.inventory import LIVE_COMMANDS, MIG_COMMANDS, has_mig

    out = {kind: (_run(runner, argv), " ".join(argv)) for kind, argv in LIVE_COMMANDS}
    if has_mig(out["list"][0]):
        for kind, argv in MIG_COMMANDS:
            text = _run(runner, argv, required=False)      # no MIG device files: a warning later
            if text:
                out[kind] = (text, " ".join(argv))
    return out


def _node_name(runner) -> str:
    return _run(runner, ("hostname", "-s")).strip()
