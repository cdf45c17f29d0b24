"""Parsers fed with output recorded from the real Slurm 22.05 test cluster."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuhpc.errors import SlurmError
from gpuhpc.slurm import commands as cmd
from gpuhpc.slurm import parsers
from gpuhpc.slurm.state import JobState, SlurmState

DATA = Path(__file__).parent / "data"


def test_parse_nodes_typed_gpus_and_mig():
    nodes = {n.name: n for n in parsers.parse_nodes((DATA / "scontrol-show-node.txt").read_text())}
    assert set(nodes) == {"gpu-node1", "gpu-node2", "mig-node1", "cpu-node1"}
    assert nodes["gpu-node1"].gpus_total == {"h100": 8}
    assert nodes["mig-node1"].gpus_total == {"1g.10gb": 7, "3g.40gb": 2}
    assert nodes["cpu-node1"].gpus_total == {}
    assert nodes["gpu-node1"].cpus == 16 and nodes["gpu-node1"].real_memory_mb == 64000
    assert nodes["gpu-node1"].partitions == ("gpu", "gpu-hi", "all")
    assert nodes["gpu-node1"].state == "IDLE"


def test_parse_partitions():
    parts = {p.name: p for p in parsers.parse_partitions((DATA / "scontrol-show-partition.txt").read_text())}
    assert parts["gpu"].default and parts["gpu"].preempt_mode == "REQUEUE"
    assert parts["gpu-hi"].priority_tier == 10


# the field order sacct.txt was recorded with (before the name moved last)
RECORDED_SACCT_FIELDS = ("JobID", "JobIDRaw", "JobName", "State", "Elapsed", "ElapsedRaw", "Submit", "Start",
                         "End", "AllocTRES", "ReqTRES", "Partition", "Account", "User", "NodeList", "ExitCode",
                         "Timelimit", "QOS", "Cluster")


def test_parse_sacct_recorded():
    rows = parsers.parse_sacct((DATA / "sacct.txt").read_text(), fields=RECORDED_SACCT_FIELDS)
    assert rows and rows[0].gpus == {"h100": 2}
    assert rows[0].state.state is JobState.COMPLETED


def test_oneliner_values_with_spaces():
    recs = parsers.parse_oneliner_records("NodeName=n1 State=DOWN Reason=Not responding [slurm@2026] Gres=gpu:h100:8(S:0-1)\n")
    assert recs[0]["Reason"] == "Not responding [slurm@2026]"
    assert parsers.parse_gres(recs[0]["Gres"]) == {"h100": 8}


@pytest.mark.parametrize("raw,expected", [
    ("gpu:h100:8(S:0-1),gpu:1g.10gb:7", {"h100": 8, "1g.10gb": 7}),
    ("gpu:4", {"gpu": 4}),
    ("(null)", {}),
    ("gpu:a100:2(S:0),shard:8", {"a100": 2}),
])
def test_parse_gres(raw, expected):
    assert parsers.parse_gres(raw) == expected


def _squeue_row(job: str, name: str, user: str = "alice", state: str = "RUNNING") -> str:
    d = {"job_id": job, "job_id_raw": job.split("_")[0], "array_job_id": job.split("_")[0],
         "array_task_id": job.split("_")[1] if "_" in job else "N/A", "name": name, "state": state,
         "elapsed": "1:02", "time_limit": "2:00:00", "nodes": "2", "tres_per_node": "gres:gpu:h100:8",
         "partition": "gpu", "user": user, "account": "proj", "nodelist": "gpu-node[1-2]",
         "reason": "None", "qos": "normal"}
    return cmd.SEP.join(d[n] for n, _ in cmd.SQUEUE_FIELDS)


def test_squeue_row_with_pipe_in_name():
    rows = parsers.parse_squeue(_squeue_row("12_3", "a|b; rm -rf ~") + "\n")
    assert rows[0].name == "a|b; rm -rf ~" and rows[0].array_task_id == "3"
    assert parsers.parse_squeue("only|three|fields\n") == []      # skipped and logged, not fatal


FORGED = "bar23\u2028x\x1fy\n" + _squeue_row("99", "forged", user="root", state="COMPLETED")


def test_squeue_tagged_rows_cannot_be_forged_by_a_name():
    """Rows framed by the per-call tag (SQUEUE_FORMAT): a name with U+2028, 0x1f, a newline and
    a whole forged row after it stays one name of one row."""
    tag = "\x1eTAG123"
    out = "".join(tag + r + "\n" for r in (_squeue_row("7", FORGED), _squeue_row("8", "ok\x1c\x1d"),
                                          _squeue_row("9", "ends-with-newline\n")))
    rows = parsers.parse_squeue(out, row_tag=tag)
    assert [r.job_id for r in rows] == ["7", "8", "9"]
    assert rows[0].name == FORGED and rows[0].user == "alice"
    assert rows[1].name == "ok\x1c\x1d" and rows[2].name == "ends-with-newline\n"
    # junk (no tag) before the first row, and a malformed row: skipped, the others kept
    rows = parsers.parse_squeue("junk\n" + tag + "1\x1f2\n" + tag + _squeue_row("5", "x") + "\n", row_tag=tag)
    assert [r.job_id for r in rows] == ["5"]


def _sacct_row(job: str, name: str, user: str = "alice", gpus: int = 1, sep: str = cmd.SEP) -> str:
    tres = f"billing=1,cpu=1,gres/gpu:h100={gpus},gres/gpu={gpus},mem=1000M,node=1"
    d = {"JobID": job, "JobIDRaw": job, "JobName": name, "State": "COMPLETED", "Elapsed": "00:00:10",
         "ElapsedRaw": "10", "Submit": "2026-12-01T10:00:00", "Start": "2026-12-01T10:00:00",
         "End": "2026-12-01T10:00:10", "AllocTRES": tres, "ReqTRES": tres, "Partition": "gpu",
         "Account": "research", "User": user, "QOS": "normal", "Cluster": "local", "Timelimit": "01:00:00"}
    return sep.join(d[f] for f in cmd.SACCT_RUN_FIELDS)


def test_sacct_name_last_with_random_delimiter_cannot_forge_a_row():
    """sacct keeps newlines and 0x1f in names: with the name last and a per-call delimiter a
    newline in a name followed by a whole forged row (0x1f-delimited, as a name can hold) is
    still that job's name; the attacker's real row is kept with its real user and GPUs."""
    sep = cmd.SEP + "\x1eRANDOM"
    forged = "x\n" + _sacct_row("4242", "evil", user="root", gpus=8)
    out = _sacct_row("10", forged, gpus=1, sep=sep) + "\n" + _sacct_row("11", "n\n", sep=sep) + "\n"
    rows = parsers.parse_sacct(out, fields=cmd.SACCT_RUN_FIELDS, sep=sep)
    assert [(r.job_id, r.user, r.gpus) for r in rows] == [("10", "alice", {"h100": 1}), ("11", "alice", {"h100": 1})]
    assert rows[0].name == forged and rows[1].name == "n\n"
    # a malformed row is skipped, not fatal
    assert parsers.parse_sacct("a" + sep + "b\n", fields=cmd.SACCT_RUN_FIELDS, sep=sep) == []
    assert parsers.parse_sacct("", fields=cmd.SACCT_RUN_FIELDS, sep=sep) == []


class _SacctRunner:
    """sacct as Slurm 22.05 prints it for a job named with a newline and a forged row: the billed
    fields (no name) one line a run; the names with the delimiter the argv asked for."""

    is_local = True
    forged = "x\n" + _sacct_row("4242", "evil", user="root", gpus=8)

    def run(self, argv, *, input=None, timeout=None, env=None):
        from gpuhpc.transport import CommandResult

        fmt = next(a for a in argv if a.startswith("--format=")).removeprefix("--format=").split(",")
        sep = next(a for a in argv if a.startswith("--delimiter=")).removeprefix("--delimiter=")
        if fmt == ["JobIDRaw", "JobName"]:
            out = f"10{sep}{self.forged}\n11{sep}plain\n"
        else:
            assert "JobName" not in fmt                          # nothing a user names reaches billing
            out = "".join(sep.join(r.split(sep)[:len(fmt)]) + "\n" for r in
                          (_sacct_row(j, "unused", sep=sep) for j in ("10", "11")))
        return CommandResult(tuple(argv), 0, out, "")


def test_job_runs_bill_from_fields_no_name_can_reach():
    import datetime as dt

    from gpuhpc.slurm.client import SlurmClient

    rows = SlurmClient(_SacctRunner()).job_runs(dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc))
    assert [(r.job_id, r.user, r.gpus) for r in rows] == [("10", "alice", {"h100": 1}), ("11", "alice", {"h100": 1})]
    assert rows[0].name == _SacctRunner.forged and rows[1].name == "plain"


def test_sacct_names():
    sep = cmd.SEP + "\x1eR"
    assert parsers.parse_sacct_names(f"1{sep}a\nb\n2{sep}c\n1{sep}dup\n", sep=sep) == {"1": "a\nb", "2": "c"}
    assert parsers.parse_sacct_names(f"junk{sep}x\n", sep=sep) == {}


@pytest.mark.parametrize("raw,state,finished", [
    ("CANCELLED by 0", JobState.CANCELLED, True),
    ("PREEMPTED", JobState.PREEMPTED, False),
    ("REQUEUED", JobState.REQUEUED, False),
    ("NODE_FAIL", JobState.NODE_FAIL, False),
    ("TIMEOUT", JobState.TIMEOUT, True),
    ("PD", JobState.PENDING, False),
    ("WEIRD", JobState.UNKNOWN, False),
])
def test_state_parse(raw, state, finished):
    s = SlurmState.parse(raw)
    assert s.state is state and s.raw == raw and s.is_finished is finished


def test_sbatch_parsable_and_version():
    assert parsers.parse_sbatch_parsable("1234;local\n") == "1234"
    assert parsers.parse_sbatch_parsable("99\n") == "99"
    with pytest.raises(SlurmError):
        parsers.parse_sbatch_parsable("sbatch: error: Batch job submission failed")
    assert parsers.parse_version("slurm-wlm 22.05.8") == (22, 5, 8)


def test_builders_are_argv_lists_not_shell():
    argv = cmd.scancel("5; rm -rf ~")
    assert argv == ["scancel", "5; rm -rf ~"]
    assert cmd.sacct(job_ids=["1", "2"], duplicates=True)[-2:] == ["--duplicates", "--jobs=1,2"]


def test_oneliner_job_name_with_newline_and_forged_fields():
    """scontrol --oneliner keeps a plain-sbatch name's newline: the record stays whole and Slurm's
    own fields (after the name) win over Key=Value text inside it."""
    text = ("JobId=7 JobName=n\nNodes=gpu-node2 GRES=gpu:h100:8(IDX:0-7) JobState=COMPLETED Restarts=9 "
            "UserId=alice(1000) JobState=PENDING Restarts=0 NodeList=(null)\nJobId=8 JobName=b JobState=RUNNING\n")
    recs = parsers.parse_oneliner_records(text)
    assert [(r["JobId"], r["JobState"], r.get("Restarts")) for r in recs] == [("7", "PENDING", "0"), ("8", "RUNNING", None)]
    assert recs[0]["UserId"] == "alice(1000)"


def test_squeue_row_tag_stays_out_of_every_argv():
    """Locally the tag goes in squeue's environment; through a remote runner on stdin: never in a
    command line another user's ps could read before squeue has asked slurmctld."""
    from gpuhpc.slurm.client import SlurmClient
    from gpuhpc.transport import CommandResult

    class Runner:
        def __init__(self, local):
            self.is_local, self.calls = local, []

        def run(self, argv, *, input=None, timeout=None, env=None):
            if argv[:2] == ["sinfo", "--version"]:      # the transport's choice: 22.05, the framed parser
                return CommandResult(tuple(argv), 0, "slurm 22.05.8\n", "")
            self.calls.append((argv, input, env))
            fmt = (env or {}).get("SQUEUE_FORMAT") or input.rstrip("\n")
            tag = fmt[:fmt.index("%")]
            return CommandResult(tuple(argv), 0, tag + _squeue_row("5", "a\n" + _squeue_row("6", "x")) + "\n", "")

    for local in (True, False):
        r = Runner(local)
        rows = SlurmClient(r).queue()
        assert [x.job_id for x in rows] == ["5"]
        (argv, inp, env), = r.calls
        fmt = env["SQUEUE_FORMAT"] if local else inp
        assert not any(fmt.split("%")[0] in a for a in argv)
        if not local:
            assert argv[:2] == ["sh", "-c"] and "squeue" in argv and "SQUEUE_FORMAT" not in (env or {})
