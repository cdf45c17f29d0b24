"""Issue 37 point 4: ``squeue/sacct --json`` (Slurm >= 23.02) read into the same records as the
framed text parsers. The data are Slurm 25.11.7's own output (built from source) for the hostile
names of tests/integration/security/test_slurm_output.py (U+2028 and 0x1f; a newline followed by a
forged squeue row; a newline followed by a forged sacct row), a held array, a job on a GPU and a
finished one; squeue's and sacct's text for the same jobs are in the comments."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhpc.errors import SlurmError
from gpuhpc.slurm import parsers

DATA = Path(__file__).parent / "data"
SQUEUE = (DATA / "squeue-25.11.json").read_text()
SACCT = (DATA / "sacct-25.11.json").read_text()


def test_squeue_json_rows_as_squeue_array_prints_them():
    rows = {r.job_id: r for r in parsers.parse_squeue_json(SQUEUE)}
    # squeue --array: 4_0 4_1 4_2 (the held array's tasks), 3 2 1 (held), 5 (running), 6 (completed)
    assert sorted(rows) == ["1", "2", "3", "4_0", "4_1", "4_2", "5", "6"]
    assert rows["1"].name == "bar23\u2028x\x1fy"
    assert rows["2"].name.startswith("a\n424242\x1f424242\x1f") and rows["2"].name.endswith("\x1fnormal")
    assert rows["3"].name.startswith("b\u2029\x1c\x1d\x1e424242\x1f") and rows["3"].name.endswith("normal\n")
    assert not [r for r in rows.values() if r.name == "forged" or r.job_id_raw == "424242"]
    # 4_0|4|4|0|PENDING|0:00|1:00|1|N/A|s25|root|root||JobHeldUser|normal|a\n...
    t = rows["4_0"]
    assert (t.job_id_raw, t.array_job_id, t.array_task_id, t.state.state.value, t.elapsed, t.time_limit, t.nodes,
            t.tres_per_node, t.partition, t.user, t.account, t.nodelist, t.reason, t.qos) == \
        ("4", "4", "0", "PENDING", "0:00", "1:00", 1, "N/A", "s25", "root", "root", "", "JobHeldUser", "normal")
    assert rows["4_2"].name == rows["2"].name
    # 1|1|1|N/A|PENDING|...
    assert (rows["1"].job_id_raw, rows["1"].array_job_id, rows["1"].array_task_id) == ("1", "1", "N/A")
    # 5|5|5|N/A|RUNNING|0:04|5:00|1|gres/gpu:h100:1|s25|root|root|s25-node1|None|normal|on-a-gpu
    r = rows["5"]
    assert (r.state.state.value, r.time_limit, r.tres_per_node, r.nodelist, r.reason, r.name) == \
        ("RUNNING", "5:00", "gres/gpu:h100:1", "s25-node1", "None", "on-a-gpu")
    # 6|6|6|N/A|COMPLETED|0:01|1:00|... (its run: end - start)
    assert (rows["6"].state.state.value, rows["6"].elapsed, rows["6"].partition) == ("COMPLETED", "0:01", "s25-hi")


def test_squeue_json_filters_by_user_and_job_id_as_well():
    assert parsers.parse_squeue_json(SQUEUE, user="nobody") == []
    assert [r.job_id for r in parsers.parse_squeue_json(SQUEUE, job_ids=["4"])] == ["4_0", "4_1", "4_2"]
    assert [r.job_id for r in parsers.parse_squeue_json(SQUEUE, job_ids=["4_1", "5"])] == ["4_1", "5"]


def test_sacct_json_rows_as_sacct_prints_them():
    rows = {r.job_id: r for r in parsers.parse_sacct_json(SACCT)}
    assert sorted(rows) == ["5", "6"]
    # 6|6|COMPLETED|00:00:01|1|...|billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1|
    #   billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=500M,node=1|s25-hi|root|root|s25-node1|0:0|00:01:00|normal|gpuhpcs25|x\n...
    r = rows["6"]
    assert r.name.startswith("x\n424243\x1f424243\x1fforged\x1f")
    assert (r.job_id_raw, r.state.state.value, r.elapsed_s, r.partition, r.account, r.user, r.nodelist,
            r.exit_code, r.time_limit, r.qos, r.cluster) == \
        ("6", "COMPLETED", 1, "s25-hi", "root", "root", "s25-node1", "0:0", "00:01:00", "normal", "gpuhpcs25")
    assert r.alloc_tres == parsers.parse_tres("billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,node=1")
    assert r.req_tres == parsers.parse_tres("billing=1,cpu=1,gres/gpu:h100=1,gres/gpu=1,mem=500M,node=1")
    assert r.gpus == {"h100": 1}
    assert r.start < r.end and r.start.count("T") == 1 and rows["5"].end == "Unknown"
    assert not [x for x in rows.values() if x.name == "forged" or x.job_id_raw == "424243"]


def test_sacct_json_steps_follow_their_job_without_allocations():
    ids = [r.job_id for r in parsers.parse_sacct_json(SACCT, allocations=False)]
    assert ids.index("6.batch") == ids.index("6") + 1


@pytest.mark.parametrize(("mb", "text"), [(500, "500M"), (1024, "1G"), (8000, "8000M"), (16384, "16G"),
                                          (1024 ** 2, "1T")])
def test_memory_in_sacct_units(mb, text):
    assert parsers.parse_sacct_json(json.dumps({"jobs": [{"job_id": 1, "tres": {"allocated": [
        {"type": "mem", "name": "", "count": mb}]}}]}))[0].alloc_tres == {"mem": text}


def test_json_errors_are_slurm_errors():
    with pytest.raises(SlurmError, match="squeue --json printed no JSON"):
        parsers.parse_squeue_json("squeue: error: Invalid user")
    with pytest.raises(SlurmError, match="sacct --json: Unable to connect"):
        parsers.parse_sacct_json(json.dumps({"jobs": [], "errors": [
            {"error_number": 7000, "description": "Unable to connect"}]}))


def test_a_malformed_json_record_is_skipped_not_fatal():
    doc = json.loads(SQUEUE)
    doc["jobs"].insert(0, {"job_id": "x"})
    assert len(parsers.parse_squeue_json(json.dumps(doc))) == 8
