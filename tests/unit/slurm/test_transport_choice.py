"""Issue 37 points 3-4: one SlurmClient, three transports. Which one serves the reads (pyslurm where
an importable pyslurm has the running Slurm's major.minor, ``--json`` from 23.02, the framed text
parsers on 22.05), how a forced choice is refused, the counter of which path served each read, and
the version cache that keeps the choice free of a subprocess per CLI start."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.slurm import pyslurm_reads, versions
from gpuhpc.slurm.client import SlurmClient
from gpuhpc.transport import CommandResult

DATA = Path(__file__).parent / "data"


class Remote:
    """A runner on another host (so no pyslurm), answering sinfo --version and squeue/sacct."""

    is_local = False

    def __init__(self, version: str, outputs: dict[str, str] | None = None):
        self.version = version
        self.outputs = outputs or {}
        self.argvs: list[list[str]] = []

    def getenv(self, key):
        return None

    def run(self, argv, *, input=None, timeout=None, env=None):
        self.argvs.append(list(argv))
        if argv[:2] == ["sinfo", "--version"]:
            return CommandResult(tuple(argv), 0, f"slurm {self.version}\n", "")
        return CommandResult(tuple(argv), 0, self.outputs.get(argv[0], ""), "")


@pytest.fixture(autouse=True)
def _no_forced_transport(monkeypatch):
    monkeypatch.delenv("GPUHPC_SLURM_TRANSPORT", raising=False)


@pytest.mark.parametrize(("version", "transport"), [("22.05.8", "cli"), ("23.02.1", "json"), ("24.11.5", "json"),
                                                    ("25.11.7", "json")])
def test_json_from_23_02_and_the_framed_parser_before(version, transport):
    assert SlurmClient(Remote(version)).transport == transport


def test_squeue_on_22_05_keeps_the_framed_parser_and_never_asks_for_json():
    r = Remote("22.05.8")
    c = SlurmClient(r)
    c.queue(user="alice")
    squeue = [a for a in r.argvs if "squeue" in a]        # over SSH: sh -c '...' sh squeue ...
    assert len(squeue) == 1 and "--json" not in squeue[0] and "--noheader" in squeue[0]
    assert c.calls == {("queue", "cli"): 1}


def test_json_transport_reads_squeue_and_sacct_json_and_counts_them():
    r = Remote("25.11.7", {"squeue": (DATA / "squeue-25.11.json").read_text(),
                           "sacct": (DATA / "sacct-25.11.json").read_text()})
    c = SlurmClient(r)
    rows = c.queue()
    acct = c.accounting(all_users=True)
    assert rows and acct
    assert [a for a in r.argvs if a[0] == "squeue"][0][:2] == ["squeue", "--json"]
    assert [a for a in r.argvs if a[0] == "sacct"][0][:2] == ["sacct", "--json"]
    assert c.calls == {("queue", "json"): 1, ("accounting", "json"): 1}


@pytest.mark.parametrize("value", ["yaml", "PYSLURM", ""])
def test_an_unknown_forced_transport_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv("GPUHPC_SLURM_TRANSPORT", value or "x y")
    with pytest.raises(UserInputError, match=r"^GPUHPC_SLURM_TRANSPORT: unknown .*use one of auto, pyslurm, json, cli"):
        SlurmClient(Remote("25.11.7")).transport


def test_forced_json_on_22_05_is_refused_and_forced_cli_on_25_11_is_honoured(monkeypatch):
    monkeypatch.setenv("GPUHPC_SLURM_TRANSPORT", "json")
    with pytest.raises(UserInputError, match=r"json needs Slurm >= 23.02 \(this is 22.05.8\)"):
        SlurmClient(Remote("22.05.8")).transport
    monkeypatch.setenv("GPUHPC_SLURM_TRANSPORT", "cli")
    assert SlurmClient(Remote("25.11.7")).transport == "cli"
    assert SlurmClient(Remote("25.11.7"), transport="json").transport == "json"     # the argument wins


def test_forced_pyslurm_over_ssh_is_refused(monkeypatch):
    monkeypatch.setenv("GPUHPC_SLURM_TRANSPORT", "pyslurm")
    with pytest.raises(UserInputError, match="pyslurm cannot be used here: the runner is not local"):
        SlurmClient(Remote("25.11.7")).transport


class Local(Remote):
    is_local = True

    def __init__(self, version, slurm_conf=None):
        super().__init__(version)
        self.slurm_conf = slurm_conf

    def getenv(self, key):
        return self.slurm_conf if key == "SLURM_CONF" else os.environ.get(key)


@pytest.fixture
def local_version(monkeypatch):
    """The running Slurm's version as the local version cache reports it."""
    box = {"v": (25, 11, 7)}
    monkeypatch.setattr(versions, "local_version", lambda path, ask: box["v"])
    return box


def test_pyslurm_only_where_its_major_minor_is_the_running_slurms(monkeypatch, local_version):
    monkeypatch.setattr(pyslurm_reads, "available_version", lambda: (25, 11, 2))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    assert SlurmClient(Local("25.11.7")).transport == "pyslurm"
    local_version["v"] = (24, 11, 5)
    assert SlurmClient(Local("24.11.5")).transport == "json"
    local_version["v"] = (22, 5, 8)
    assert SlurmClient(Local("22.05.8")).transport == "cli"
    monkeypatch.setenv("GPUHPC_SLURM_TRANSPORT", "pyslurm")
    with pytest.raises(UserInputError, match=r"pyslurm 25.11.2 does not match Slurm 22.05.8"):
        SlurmClient(Local("22.05.8")).transport


def test_pyslurm_not_for_a_client_of_another_slurm_conf(monkeypatch, local_version):
    """pyslurm reads the process's SLURM_CONF: a client of another cluster's conf uses the CLI."""
    monkeypatch.setattr(pyslurm_reads, "available_version", lambda: (25, 11, 2))
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    assert SlurmClient(Local("25.11.7", slurm_conf="/var/tmp/private/slurm.conf")).transport == "json"
    assert SlurmClient(Local("25.11.7", slurm_conf="/etc/slurm/slurm.conf")).transport == "pyslurm"


def test_pyslurm_absent_costs_no_import():
    assert pyslurm_reads.available_version() is None     # not installed in the project's venv


def _fake_sinfo(bin_dir: Path, version: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    exe = bin_dir / "sinfo"
    exe.write_text(f"#!/bin/sh\necho 'slurm {version}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_version_cache_asks_sinfo_once_per_binary(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    exe = _fake_sinfo(tmp_path / "bin", "25.11.7")
    asked = []

    def ask():
        asked.append(1)
        return os.popen(str(exe) + " --version").read()

    path = str(tmp_path / "bin")
    assert versions.local_version(path, ask) == (25, 11, 7)
    assert versions.local_version(path, ask) == (25, 11, 7)
    assert len(asked) == 1
    # an upgrade replaces the binary: the next call asks again
    exe.write_text("#!/bin/sh\necho 'slurm 26.05.1'\n")
    os.utime(exe, ns=(exe.stat().st_atime_ns, exe.stat().st_mtime_ns + 10**9))
    assert versions.local_version(path, ask) == (26, 5, 1)
    assert len(asked) == 2


def test_version_cache_survives_an_unwritable_cache(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))      # a file: no directory under it
    _fake_sinfo(tmp_path / "bin", "22.05.8")
    assert versions.local_version(str(tmp_path / "bin"), lambda: "slurm 22.05.8") == (22, 5, 8)


def test_pyslurm_client_reads_duplicates_through_json_and_counts_that(monkeypatch, local_version):
    """pyslurm.db has no --duplicates: a billing read (every requeued run) goes through --json."""
    monkeypatch.setattr(pyslurm_reads, "available_version", lambda: (25, 11, 2))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    r = Local("25.11.7")
    r.outputs = {"sacct": '{"jobs": [], "errors": []}'}
    c = SlurmClient(r)
    assert c.transport == "pyslurm"
    assert c.accounting(job_ids=["7"], duplicates=True) == []
    assert [a[:2] for a in r.argvs if a[0] == "sacct"] == [["sacct", "--json"]]
    assert c.calls == {("accounting", "json"): 1}
