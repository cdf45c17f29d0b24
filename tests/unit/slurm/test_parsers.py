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


def test_parse_sacct_recorded():
    rows = parsers.parse_sacct((DATA / "sacct.txt").read_text())
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


def test_squeue_row_with_pipe_in_name():
    fields = ["12_3", "15", "12", "3", "a|b; rm -rf ~", "RUNNING", "1:02", "2:00:00", "2",
              "gres:gpu:h100:8", "gpu", "alice", "proj", "gpu-node[1-2]", "None", "normal"]
    rows = parsers.parse_squeue(cmd.SEP.join(fields) + "\n")
    assert rows[0].name == "a|b; rm -rf ~" and rows[0].array_task_id == "3"
    with pytest.raises(SlurmError):
        parsers.parse_squeue("only|three|fields\n")


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
