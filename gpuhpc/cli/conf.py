"""``gpuhpc conf ...``: validate a cluster spec and render its Slurm config files."""
from __future__ import annotations

from pathlib import Path

import click

from gpuhpc.cli.main import help_for

_SPEC = click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
_SLURM_VERSION = click.option(
    "--slurm-version", default=None, metavar="MAJOR.MINOR",
    help="The Slurm release the files are for (what later releases renamed is written their way; default 22.05).")


@click.group("conf", help=help_for("conf"), no_args_is_help=True)
def conf() -> None:
    pass


def _load(spec_path: Path):
    from gpuhpc.spec.cluster import load_spec

    return load_spec(spec_path)


def _warn_all(warnings: list[str]) -> None:
    from gpuhpc.cli._console import warn

    for w in warnings:
        warn(w)


@conf.command("validate")
@_SPEC
@_JSON
def validate_cmd(spec_path: Path, as_json: bool) -> None:
    """Check a cluster spec (SPEC: YAML); exit 2 with a one-line error naming the field if Slurm
    would reject it."""
    from gpuhpc.conf.validate import validate

    spec = _load(spec_path)
    warnings = validate(spec)
    _warn_all(warnings)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"ok": True, "cluster": spec.name, "nodes": len(spec.nodes()), "warnings": warnings})
    else:
        click.echo(f"ok: cluster {spec.name}, {len(spec.nodes())} nodes, {len(spec.partitions)} partitions")


@conf.command("render")
@_SPEC
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Directory to write the files into.")
@_JSON
@_SLURM_VERSION
def render_cmd(spec_path: Path, out_dir: Path, as_json: bool, slurm_version: str | None) -> None:
    """Validate the cluster spec SPEC, then write slurm.conf, gres.conf, cgroup.conf, topology.conf,
    slurmdbd.conf.

    Nothing is written unless the whole spec validates. slurmdbd.conf's StoragePass comes from
    $GPUHPC_SLURMDBD_STORAGE_PASS (a placeholder otherwise).
    """
    from gpuhpc.conf.render import STORAGE_PASS_ENV, render_spec, write_files
    from gpuhpc.config import getenv

    spec = _load(spec_path)
    storage_pass = getenv(STORAGE_PASS_ENV)
    files, warnings = render_spec(spec, storage_pass=storage_pass, slurm_version=slurm_version)
    _warn_all(warnings)
    if spec.slurmdbd is not None and not storage_pass:
        _warn_all([f"slurmdbd.conf has a placeholder StoragePass (set {STORAGE_PASS_ENV})"])
    written = write_files(files, out_dir)
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json({"written": [str(p) for p in written], "warnings": warnings})
    else:
        for p in written:
            click.echo(str(p))


@conf.command("context")
@_SPEC
@click.option("--billing", type=click.Path(dir_okay=False, path_type=Path),
              help="The ledger's billing document (gpuhpc ledger billing): TRESBillingWeights per partition.")
@_SLURM_VERSION
def context_cmd(spec_path: Path, billing: Path | None, slurm_version: str | None) -> None:
    """Print the validated template context of the cluster spec SPEC as JSON (what the Ansible
    roles render from)."""
    import json

    from gpuhpc.conf.context import DEFAULT_SLURM_VERSION, build_context, slurm_release
    from gpuhpc.conf.validate import validate

    slurm_release(slurm_version or DEFAULT_SLURM_VERSION)      # a malformed one exits 2 before the spec is read
    spec = _load(spec_path)
    _warn_all(validate(spec))
    doc = None
    if billing is not None:
        from gpuhpc.errors import UserInputError

        try:
            doc = json.loads(billing.read_text())
        except (OSError, ValueError) as exc:
            raise UserInputError(f"--billing {billing}: {exc}") from None
    click.echo(json.dumps(build_context(spec, doc, slurm_version=slurm_version or DEFAULT_SLURM_VERSION),
                          indent=1, sort_keys=True))

