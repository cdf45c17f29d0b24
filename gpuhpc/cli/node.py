"""``gpuhpc node``: what a GPU node has, as gres.conf lines and a sizing report."""
from __future__ import annotations

import sys

import typer


def register(app: typer.Typer) -> None:
    node_app = typer.Typer(help="GPU node inventory: gres.conf lines, node sizing checks.", no_args_is_help=True)
    app.add_typer(node_app, name="node")

    @node_app.command("inventory")
    def inventory(
        smi_xml: str | None = typer.Option(None, "--smi-xml", help="nvidia-smi -q -x output (or -q text)."),
        topo: str | None = typer.Option(None, "--topo", help="nvidia-smi topo -m output."),
        listing: str | None = typer.Option(None, "--list", help="nvidia-smi -L output."),
        mig_lgi: str | None = typer.Option(None, "--mig-lgi", help="nvidia-smi mig -lgi output."),
        mig_lgip: str | None = typer.Option(None, "--mig-lgip", help="nvidia-smi mig -lgip output."),
        node: str | None = typer.Option(None, "--node", help="Prefix lines with NodeName= (live: this host)."),
        cpus: int | None = typer.Option(None, "--cpus", help="vCPUs of the node (live: this host's)."),
        gpu_type: str | None = typer.Option(None, "--type", help="Force the GPU Type= name."),
        type_style: str = typer.Option("short", "--type-style", help="short (h100, 1g.10gb) or slurm "
                                       "(nvidia_h100_80gb_hbm3, as AutoDetect=nvml names them)."),
        gres_only: bool = typer.Option(False, "--gres-only", help="Only the gres.conf lines, no report comments."),
        as_json: bool = typer.Option(False, "--json", help="JSON output."),
    ) -> None:
        """gres.conf lines + node-sizing report, from nvidia-smi captures or live nvidia-smi."""
        from gpuhpc.inventory import Sources, collect

        inv = collect(Sources(smi_xml, topo, listing, mig_lgi, mig_lgip), node=node, cpus=cpus,
                      type_style=type_style, type_override=gpu_type)
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

    @node_app.command("clique")
    def clique_cmd(
        smi_xml: str | None = typer.Option(None, "--smi-xml", help="nvidia-smi -q -x output (default: run it)."),
        node: str | None = typer.Option(None, "--node", help="Host name to print (default: this host)."),
    ) -> None:
        """Print 'HOST CLUSTERUUID.CLIQUEID' (the node's NVLink domain) for
        `gpuhpc topology from-ibnetdiscover --format block --block-by nvlink --cliques FILE`."""
        import socket

        from gpuhpc.errors import UserInputError
        from gpuhpc.inventory import clique

        cid = clique(smi_xml)
        if cid is None:
            raise UserInputError("the driver reports no NVLink clique for these GPUs (not an NVL/GB200 system, "
                                 "or fabric manager not running)", field="--smi-xml" if smi_xml else None)
        sys.stdout.write(f"{node or socket.gethostname().split('.')[0]} {cid}\n")
