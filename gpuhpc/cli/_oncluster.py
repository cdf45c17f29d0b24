"""``gpuhpc --cluster NAME sweep|report|sprint|profile ...`` from a laptop.

A sweep's state (its database, trial files and driver job), a sprint's (a sweep, waited for),
a profiled job's traces and the reports' sources (the ledger, Prometheus) live on the cluster,
so these commands run *there*, as on the login node: ``gpuhpc`` on the cluster through the
runner (:func:`gpuhpc.jobs.remote.run_gpuhpc`), with the profile's Python, its output and exit
code passed back. The one code path stays the runner: this module only moves what the command
names on the laptop -- ``sweep run FILE`` and ``sprint FILE`` validate FILE here (bad input
exits 2 before anything is sent), upload the code snapshot and FILE and start in the
snapshot's copy of this directory; ``--html FILE`` is written on the cluster and copied back.
"""
from __future__ import annotations

import os
import sys

import click


class OnCluster:
    """A command whose state lives on the cluster: with a remote runner (``--cluster NAME``,
    ``GPUHPC_SSH_HOST``) the whole command line runs there (mixed into a click class)."""

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        # a subcommand of gpuhpc (not the group alone), not shell completion resolving a name
        if parent is not None and not (extra.get("resilient_parsing") or parent.resilient_parsing):
            from gpuhpc.cli.main import debugging

            code = main([info_name, *args], debugging())
            if code is not None:
                raise click.exceptions.Exit(code)
        return super().make_context(info_name, args, parent=parent, **extra)


class OnClusterGroup(OnCluster, click.Group):
    """A command group whose state lives on the cluster (``sweep``, ``report``)."""


class OnClusterCommand(OnCluster, click.Command):
    """A command whose state lives on the cluster (``sprint``, ``profile``)."""


def main(args: list[str], debug: bool) -> int | None:
    """Run ``gpuhpc ARGS`` on the cluster and return its exit code; None when the runner is
    local (the command runs here as usual) or for ``--help``."""
    if "--help" in args or "-h" in args:
        return None
    from gpuhpc.transport import default_runner

    from gpuhpc.cli.main import run_guarded

    runner = default_runner()
    if runner.is_local:
        return None
    return run_guarded(lambda: _forward(runner, list(args), debug), lambda: debug)


def _forward(runner, args: list[str], debug: bool) -> int:
    import posixpath
    import uuid

    from gpuhpc.jobs import remote, snapshot

    cwd, env = None, {}
    if args[:2] == ["sweep", "run"] or args[:1] == ["sprint"]:
        from gpuhpc.cli.main import cli, input_error

        sweep = args[0] == "sweep"
        # by name: cli.sweep and cli.sprint import this module; made with no parent, neither forwards
        cmd = cli.get_command(None, "sweep").commands["run"] if sweep else cli.get_command(None, "sprint")
        first, usage = (2, "gpuhpc sweep run") if sweep else (1, "gpuhpc sprint")
        try:                                # the command's own options, parsed, nothing run
            file = cmd.make_context(usage, args[first:]).params["file"]
        except click.UsageError as exc:
            raise input_error(exc, usage) from None
        if sweep:
            from gpuhpc.sweeps.spec import load_file

            workdir = load_file(file).workdir    # bad input: exit 2 here, nothing sent
        else:
            from gpuhpc.sprints.spec import load_file as load_sprint

            load_sprint(file)                   # a sprint runs where it was started: no workdir field
            workdir = None
        snap = snapshot.collect(".", (), snapshot.max_mb(runner)) if workdir is None else None
        if snap is not None:
            up = snapshot.upload(snap, runner)
            cwd, env = snapshot.workdir_in(snap, up), {"GPUHPC_SNAPSHOT": up.path}
            sys.stderr.write(up.summary() + "\n")
        at = args.index(file, first)
        args[at] = remote.stage_file(runner, file, "sweep-files" if sweep else "sprint-files")
    html = None
    for i, a in enumerate(args):
        if a == "--html" and i + 1 < len(args) or a.startswith("--html="):
            html = a.partition("=")[2] if "=" in a else args[i + 1]
            there = posixpath.join(snapshot.remote_base(runner), "reports", f"{uuid.uuid4().hex}.html")
            runner.makedirs(posixpath.dirname(there))
            args[i:i + (1 if "=" in a else 2)] = ["--html", there]
            break
    res = remote.run_gpuhpc(runner, (["--debug"] if debug else []) + args, cwd=cwd, env=env or None)
    err = res.stderr
    if html is not None:
        if res.ok:
            from gpuhpc.fsutil import write_atomic

            write_atomic(html, runner.read_bytes(there))
            err = err.replace(there, os.path.abspath(html))
        runner.run(["rm", "-f", "--", there], timeout=60)
    sys.stdout.write(res.stdout)
    sys.stderr.write(err)
    return res.returncode
