"""The CLI's error contract (bad input exits 2 with one line, no traceback) and its start-up
contract: ``gpuhpc CMD`` imports only CMD's module, and the fast commands import no rich (checked
by what is imported, never by timing; bench/cli_startup.py times them). One framework: click, its
help and its shell completion for every command."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import os

from gpuhpc.cli.main import COMMANDS, cli, main

FAST = ("submit", "jobs", "status", "logs", "cancel")
HEAVY = ("rich", "pydantic", "sqlalchemy", "jinja2", "yaml", "boto3", "paramiko")


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """``gpuhpc ARGV`` in a fresh interpreter; stdout ends with a JSON line naming which of
    HEAVY and which gpuhpc.cli modules got imported."""
    code = ("import sys, json\nfrom gpuhpc.cli.main import main\n"
            "try:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
            f"heavy = [m for m in {HEAVY!r} if m in sys.modules]\n"
            "cli = sorted(m for m in sys.modules if m.startswith('gpuhpc.cli.'))\n"
            "print(json.dumps({'rc': rc, 'heavy': heavy, 'cli': cli}))\n")
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)


def _report(res: subprocess.CompletedProcess) -> dict:
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_unknown_command_and_missing_argument_exit_2(capsys):
    assert main(["nosuch"]) == 2
    assert main(["--bogus"]) == 2
    assert main(["conf", "render"]) == 2
    assert main(["status"]) == 2
    assert main(["cancel", "12x"]) == 2
    assert main(["jobs", "--bogus"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "No such command 'nosuch'" in err and "No such option '--bogus'" in err


def test_fast_command_bad_input_is_one_line_exit_2():
    for argv in (["submit", "--name", "a\nb", "--dry-run", "--", "true"], ["status"], ["cancel", "1;2"],
                 ["logs", "x"]):
        res = _cli(*argv)
        assert _report(res)["rc"] == 2, (argv, res.stderr)
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error: "), (argv, res.stderr)


def _module(name: str) -> str:
    return "gpuhpc.cli." + COMMANDS[name][0].partition(":")[0]


def test_root_help_lists_every_command_and_imports_no_group():
    res = _cli("--help")
    rep = _report(res)
    assert rep["rc"] == 0 and rep["heavy"] == []
    assert rep["cli"] == ["gpuhpc.cli.main"]
    assert res.stdout.startswith("Usage: gpuhpc [OPTIONS] COMMAND [ARGS]...\n")
    for name in COMMANDS:
        assert f"\n  {name} " in res.stdout
    assert _report(_cli())["rc"] == 2            # no command: the help, exit 2


@pytest.mark.parametrize("name", FAST)
def test_fast_commands_import_only_their_module(name):
    res = _cli(name, "--help")
    rep = _report(res)
    assert rep["rc"] == 0, res.stderr
    assert rep["heavy"] == [], rep
    assert set(rep["cli"]) <= {"gpuhpc.cli.main", _module(name)}
    assert res.stdout.startswith(f"Usage: gpuhpc {name} [OPTIONS]")


def test_one_help_style_for_every_command():
    """`gpuhpc sweep run --help` and `gpuhpc submit --help` look alike: click's Usage/Options."""
    for argv in (["submit"], ["sweep", "run"], ["jobs"], ["conf", "render"], ["ledger", "price", "set"]):
        res = _cli(*argv, "--help")
        assert _report(res)["rc"] == 0, res.stderr
        out = res.stdout
        assert out.startswith(f"Usage: gpuhpc {' '.join(argv)} [OPTIONS]"), out
        assert "\nOptions:\n" in out and "  --help  " in out, out


def test_submit_dry_run_needs_no_rich(tmp_path):
    res = _cli("submit", "--dry-run", "--gpus", "1", "--", "true")
    rep = _report(res)
    assert rep["rc"] == 0, res.stderr
    assert "rich" not in rep["heavy"]
    assert "#SBATCH" in res.stdout


def test_a_group_imports_only_its_module():
    rep = _report(_cli("cluster", "--help"))
    assert rep["rc"] == 0
    assert {m for m in rep["cli"] if m not in ("gpuhpc.cli._console",)} == {"gpuhpc.cli.main", "gpuhpc.cli.cluster"}


def test_command_table_matches_the_commands():
    """COMMANDS (what `gpuhpc --help` prints without importing anything) cannot drift from
    the commands: each entry names a click command of that name whose short help is the entry's."""
    import click

    ctx = click.Context(cli)
    for name, (target, help_) in COMMANDS.items():
        module, _, attr = target.partition(":")
        cmd = getattr(importlib.import_module(f"gpuhpc.cli.{module}"), attr)
        assert isinstance(cmd, click.Command) and cmd.name == name, name
        assert cmd.get_short_help_str(1000) == help_, name
        assert cli.get_command(ctx, name) is cmd


def test_help_wraps_to_the_width():
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "--help"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COLUMNS": "60"})
    assert res.returncode == 0, res.stderr
    assert max(len(line) for line in res.stdout.splitlines()) <= 60
    assert "--debug" in res.stdout and "Commands:" in res.stdout


def test_a_bug_is_one_line_exit_1_and_a_traceback_only_with_debug(monkeypatch, capsys):
    import gpuhpc.cli.jobs as jobs

    def boom(user=None):
        raise RuntimeError("boom")

    monkeypatch.setattr(jobs, "job_rows", boom)
    monkeypatch.delenv("GPUHPC_DEBUG", raising=False)
    assert main(["jobs"]) == 1
    err = capsys.readouterr().err
    assert err == "error: unexpected RuntimeError: boom (run with --debug for a traceback)\n"
    with pytest.raises(RuntimeError):
        main(["--debug", "jobs"])
