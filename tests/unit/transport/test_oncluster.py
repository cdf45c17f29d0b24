"""gpuhpc.cli._oncluster: `--cluster NAME sweep|report ...` run gpuhpc on the cluster through the
runner; what names laptop files is moved first (a recording runner stands in for SSH)."""
from __future__ import annotations

import pytest

from gpuhpc.cli import _oncluster
from gpuhpc.transport import CommandResult


class Recording:
    is_local = False

    def __init__(self, rc: int = 0, out: str = "", err: str = "") -> None:
        self.settings = {"python": "/py", "remote_dir": "/r"}
        self.calls: list[list[str]] = []
        self.rc, self.out, self.err = rc, out, err

    def run(self, argv, *, input=None, timeout=None, env=None):
        self.calls.append(list(argv))
        if argv[0] == "rm":
            return CommandResult(tuple(argv), 0, "", "")
        err = self.err.replace("PATH", argv[-1]) if "--html" in argv else self.err
        return CommandResult(tuple(argv), self.rc, self.out, err)

    def makedirs(self, path):
        pass

    def read_bytes(self, path):
        return b"<html>page</html>"


@pytest.fixture
def on(monkeypatch):
    def use(runner):
        monkeypatch.setattr("gpuhpc.transport.default_runner", lambda: runner)
        return runner
    return use


def test_a_local_runner_leaves_the_command_here(on):
    class Local:
        is_local = True

    on(Local())
    assert _oncluster.main(["sweep", "best", "3"], False) is None
    assert _oncluster.main(["sweep", "best", "--help"], False) is None


def test_output_and_exit_code_come_back(on, capsys):
    r = on(Recording(rc=2, out="", err="error: ID: no sweep 9\n"))
    assert _oncluster.main(["sweep", "best", "9", "--json"], True) == 2
    assert r.calls == [["/py", "-m", "gpuhpc", "--debug", "sweep", "best", "9", "--json"]]
    assert capsys.readouterr().err == "error: ID: no sweep 9\n"


def test_html_is_written_there_and_copied_back(on, capsys, tmp_path):
    r = on(Recording(err="wrote PATH\n"))
    page = tmp_path / "cost.html"
    assert _oncluster.main(["report", "cost", f"--html={page}"], False) == 0
    there = r.calls[0][-1]
    assert r.calls[0][:-1] == ["/py", "-m", "gpuhpc", "report", "cost", "--html"]
    assert there.startswith("/r/reports/") and there.endswith(".html")
    assert page.read_text() == "<html>page</html>"
    assert capsys.readouterr().err == f"wrote {page}\n"
    assert r.calls[1] == ["rm", "-f", "--", there]


def test_a_cluster_without_gpuhpc_is_one_line(on, capsys):
    on(Recording(rc=1, err="Traceback ...\nModuleNotFoundError: No module named gpuhpc\n"))
    assert _oncluster.main(["sweep", "status", "1"], False) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the cluster cannot run gpuhpc with /py" in err


def test_a_bad_sweep_file_sends_nothing(on, capsys, tmp_path, monkeypatch):
    r = on(Recording())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("name: x\ncommand: 'true'\nparameters: {x: {type: int, low: 5, high: 1}}\n"
                                     "metric: {name: loss}\n")
    assert _oncluster.main(["sweep", "run", "s.yaml"], False) == 2
    assert r.calls == [] and "parameters.x" in capsys.readouterr().err


class Staging(Recording):
    """... that also takes files (stage_file: exists, then put_file)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.put: list[tuple[str, str]] = []

    def exists(self, path):
        return False

    def put_file(self, local, path, mode=0o644):
        self.put.append((local, path))


SPRINT = ("name: s\ncommand: python t.py --batch-size {batch_size}\naxes: {batch_size: [32, 64]}\n"
          "request: false\nprices: {h100: 2.5}\nmetric: samples_per_s\nresources: {partition: cpu, time: 2m}\n")


@pytest.mark.parametrize("args", [["sprint", "sp.yaml", "--json"], ["profile", "12", "--json"]])
def test_sprint_and_profile_run_on_the_cluster(on, tmp_path, monkeypatch, args):
    """``gpuhpc --cluster NAME sprint FILE`` / ``profile JOBID`` go through the click command (as
    ``sweep`` and ``report`` do): gpuhpc runs there; a sprint's FILE is validated here and copied."""
    from click.testing import CliRunner

    from gpuhpc.cli.main import cli

    r = on(Staging(out='{"ok": 1}\n'))
    monkeypatch.chdir(tmp_path)                 # no git repository: no snapshot
    (tmp_path / "sp.yaml").write_text(SPRINT)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0 and res.output == '{"ok": 1}\n', res.output
    if args[0] == "profile":
        assert r.calls == [["/py", "-m", "gpuhpc", "profile", "12", "--json"]]
        return
    [(local, there)] = r.put
    assert local == "sp.yaml" and there.startswith("/r/sprint-files/") and there.endswith("-sp.yaml")
    assert r.calls == [["/py", "-m", "gpuhpc", "sprint", there, "--json"]]


def test_a_bad_sprint_file_sends_nothing(on, capsys, tmp_path, monkeypatch):
    r = on(Staging())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sp.yaml").write_text(SPRINT.replace("{batch_size}", "32"))     # an axis the command ignores
    assert _oncluster.main(["sprint", "sp.yaml"], False) == 2
    assert r.calls == [] and r.put == [] and "axes.batch_size" in capsys.readouterr().err
