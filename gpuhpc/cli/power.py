"""``gpuhpc power``: the programs Slurm's power saving runs for cloud nodes (ResumeProgram,
SuspendProgram, ResumeFailProgram) and the reconciler a timer runs (docs/elastic.md)."""
from __future__ import annotations

import click

from gpuhpc.cli.main import help_for

_CONFIG = click.option("--config", "config_path", envvar="GPUHPC_ELASTIC_CONFIG",
                       help="The elastic config: JSON (gpuhpc conf context) or a cluster spec YAML "
                            "[env GPUHPC_ELASTIC_CONFIG; default /etc/gpuhpc/elastic.json].")


@click.group("power", help=help_for("power"), no_args_is_help=True)
def power() -> None:
    pass


def _program(which: str, hostlist: str, config_path: str | None) -> int:
    from gpuhpc import hostlist as hl
    from gpuhpc.elastic.config import load_config
    from gpuhpc.elastic.power import run_program

    hl.expand(hostlist, field="HOSTLIST")           # a malformed hostlist is refused before anything is read
    config = load_config(config_path)
    for plan in run_program(which, hostlist, config, config_path):
        click.echo(f"{plan.op} {plan.pool} {','.join(plan.nodes)}" + (f" job {plan.job_id}" if plan.job_id else ""),
                   err=True)
    return 0


@power.command("resume")
@click.argument("hostlist")
@_CONFIG
def resume(hostlist: str, config_path: str | None) -> int:
    """ResumeProgram: launch instances for HOSTLIST (one launch per job of SLURM_RESUME_FILE)."""
    return _program("resume", hostlist, config_path)


@power.command("suspend")
@click.argument("hostlist")
@_CONFIG
def suspend(hostlist: str, config_path: str | None) -> int:
    """SuspendProgram: end the instances of HOSTLIST."""
    return _program("suspend", hostlist, config_path)


@power.command("resume-fail")
@click.argument("hostlist")
@_CONFIG
def resume_fail(hostlist: str, config_path: str | None) -> int:
    """ResumeFailProgram: end what HOSTLIST launched, set it DOWN and cool its pool down."""
    return _program("resume-fail", hostlist, config_path)


@power.command("reconcile")
@_CONFIG
@click.option("--json", "as_json", is_flag=True, help="JSON output.")
def reconcile(config_path: str | None, as_json: bool) -> int:
    """One reconciler pass: orphans, lost instances, stuck boots, reclaims, cooldowns."""
    from gpuhpc.elastic.config import load_config
    from gpuhpc.elastic.reconcile import reconcile_once

    actions = reconcile_once(load_config(config_path))
    if as_json:
        from gpuhpc.cli._console import print_json

        print_json([{"kind": a.kind, "target": a.target, "reason": a.reason} for a in actions])
    else:
        for a in actions:
            click.echo(f"{a.kind} {a.target}" + (f" ({a.reason})" if a.reason else ""))
    return 0


@power.command("unprotect")
@click.argument("pool")
@_CONFIG
def unprotect(pool: str, config_path: str | None) -> int:
    """Return a protected pool (boot failures in a row) to service: its nodes back, its count reset."""
    from gpuhpc.elastic.config import load_config
    from gpuhpc.elastic.reconcile import unprotect as _unprotect
    from gpuhpc.errors import UserInputError

    config = load_config(config_path)
    if pool not in [p.name for p in config.pools]:
        raise UserInputError(f"no cloud pool {pool!r}", field="POOL",
                             hint="one of: " + ", ".join(p.name for p in config.pools))
    nodes = _unprotect(config, pool)
    click.echo(f"pool {pool} unprotected" + (f"; nodes returned: {','.join(nodes)}" if nodes else ""), err=True)
    return 0


@power.command("ingest")
@_CONFIG
def ingest(config_path: str | None) -> int:
    """Fold the instance journal into the ledger (instance-hours; gpuhpc report instances)."""
    from gpuhpc.elastic import journal
    from gpuhpc.elastic.config import load_config
    from gpuhpc.ledger import instances

    config = load_config(config_path)
    n = instances.ingest(journal.read(config.state_dir))
    click.echo(f"{n} instance(s) written to the ledger", err=True)
    return 0
