"""``gpuhpc conf ...``: validate a cluster spec and render its Slurm config files."""
from __future__ import annotations

import os
from pathlib import Path

import typer

conf_app = typer.Typer(help="Cluster spec -> Slurm config files (slurm.conf, gres.conf, ...).",
                       no_args_is_help=True)


def _load(spec_path: Path):
    from gpuhpc.spec.cluster import load_spec

    return load_spec(spec_path)


def _warn_all(warnings: list[str]) -> None:
    from gpuhpc.cli._console import warn

    for w in warnings:
        warn(w)


@conf_app.command("validate")
def validate_cmd(spec_path: Path = typer.Argument(..., metavar="SPEC", help="Cluster spec YAML."),
                 as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Check a cluster spec; exit 2 with a one-line error naming the field if Slurm would reject it."""
    from gpuhpc.conf.validate import validate

    spec = _load(spec_path)
    warnings = validate(spec)
    _warn_all(warnings)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"ok": True, "cluster": spec.name, "nodes": len(spec.nodes()), "warnings": warnings})
    else:
        typer.echo(f"ok: cluster {spec.name}, {len(spec.nodes())} nodes, {len(spec.partitions)} partitions")


@conf_app.command("render")
def render_cmd(spec_path: Path = typer.Argument(..., metavar="SPEC", help="Cluster spec YAML."),
               out_dir: Path = typer.Option(..., "-o", "--out", help="Directory to write the files into."),
               as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Validate, then write slurm.conf, gres.conf, cgroup.conf, topology.conf, slurmdbd.conf.

    Nothing is written unless the whole spec validates. slurmdbd.conf's StoragePass comes from
    $GPUHPC_SLURMDBD_STORAGE_PASS (a placeholder otherwise).
    """
    from gpuhpc.conf.render import STORAGE_PASS_ENV, render_spec, write_files

    spec = _load(spec_path)
    storage_pass = os.environ.get(STORAGE_PASS_ENV)
    files, warnings = render_spec(spec, storage_pass=storage_pass)
    _warn_all(warnings)
    if spec.slurmdbd is not None and not storage_pass:
        _warn_all([f"slurmdbd.conf has a placeholder StoragePass (set {STORAGE_PASS_ENV})"])
    written = write_files(files, out_dir)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"written": [str(p) for p in written], "warnings": warnings})
    else:
        for p in written:
            typer.echo(str(p))


@conf_app.command("context")
def context_cmd(spec_path: Path = typer.Argument(..., metavar="SPEC", help="Cluster spec YAML."),
                billing: Path = typer.Option(None, "--billing", dir_okay=False,
                                             help="The ledger's billing document (gpuhpc ledger billing): "
                                                  "TRESBillingWeights per partition.")) -> None:
    """Print the validated template context as JSON (what the Ansible roles render from)."""
    import json

    from gpuhpc.conf.context import build_context
    from gpuhpc.conf.validate import validate

    spec = _load(spec_path)
    _warn_all(validate(spec))
    doc = None
    if billing is not None:
        from gpuhpc.errors import UserInputError

        try:
            doc = json.loads(billing.read_text())
        except (OSError, ValueError) as exc:
            raise UserInputError(f"--billing {billing}: {exc}") from None
    typer.echo(json.dumps(build_context(spec, doc), indent=1, sort_keys=True))


def register(app: typer.Typer) -> None:
    app.add_typer(conf_app, name="conf")
