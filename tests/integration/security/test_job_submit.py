"""Issue 26 point 7: job_submit.lua counts GPUs from every way Slurm 22.05 takes them, and holds
an update that enlarges a pending job to the same budget.

1. The repository's script under the real liblua (Slurm's own Lua 5.1) with job descriptors as
   slurmctld passes them (unset numbers are NO_VAL/NO_VAL16): every GPU form and an enlarging
   ``slurm_job_modify`` are refused; a job that fits, an administrator's update and a shrinking
   update pass.
2. On the running cluster, as the throwaway user with a per-user budget of 0.5 GPU-hours left:
   plain ``sbatch --gpus-per-task=8``, ``--gpus-per-socket``, ``--gpus``, a GPU array are refused
   with the budget in words; a held 1-GPU job is accepted, and ``scontrol update`` enlarging it
   (more GPUs, more nodes) is refused and changes nothing.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import shutil
from pathlib import Path

import pytest

from gpuhpc.ledger import budget
from polling import wait_for

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[3] / "slurm-conf" / "job_submit.lua"
NO_VAL, NO_VAL16 = 4294967294, 65534
USER = "mallory"


class Lua:
    """The real script in Slurm's Lua (liblua5.1), a ``slurm`` table like slurmctld's."""

    def __init__(self, script_dir: Path) -> None:
        name = ctypes.util.find_library("lua5.1") or "liblua5.1.so.0"
        self.lib = lua = ctypes.CDLL(name)
        lua.luaL_newstate.restype = ctypes.c_void_p
        lua.lua_tolstring.restype = ctypes.c_char_p
        self.L = ctypes.c_void_p(lua.luaL_newstate())
        lua.luaL_openlibs(self.L)
        self.run(f"""slurm = {{SUCCESS = 0, ERROR = -1,
            log_user = function(fmt, ...) _msg = string.format(fmt, ...) end,
            log_info = function() end, log_error = function(fmt, ...) _err = string.format(fmt, ...) end}}
            return tostring(dofile({str(script_dir / "job_submit.lua")!r}))""")

    def run(self, code: str) -> str:
        rc = self.lib.luaL_loadstring(self.L, code.encode()) or self.lib.lua_pcall(self.L, 0, 1, 0)
        out = self.lib.lua_tolstring(self.L, -1, None)
        self.lib.lua_settop(self.L, -2)
        assert rc == 0, out
        return (out or b"").decode()


def _table(d: dict) -> str:
    return "{" + ", ".join(f"{k} = {v!r}" if isinstance(v, str) else f"{k} = {v}" for k, v in d.items()
                           if v is not None) + "}"


BASE = {"account": "research", "partition": "gpu", "user_name": USER, "time_limit": 10, "min_nodes": NO_VAL,
        "num_tasks": NO_VAL, "ntasks_per_node": NO_VAL16, "sockets_per_node": NO_VAL16}


@pytest.fixture()
def lua(tmp_path):
    shutil.copy(SCRIPT, tmp_path / "job_submit.lua")
    # 0.5 GPU-hours (30 GPU-minutes) left for this user in research; any job of > 3 GPUs x 10 min is too big
    (tmp_path / "gpuhpc-budgets.txt").write_text(f"budget\tresearch\t{USER}\tgpu_hours\ttest\t0\t1.00\t0.50\n")
    return Lua(tmp_path)


def submit(lua: Lua, parts: str = "{}", **fields) -> tuple[str, str]:
    desc = {**BASE, **fields}
    return tuple(lua.run(f"_msg = nil; _err = nil; local rc = slurm_job_submit({_table(desc)}, {parts}, 1000); "
                         f"return tostring(rc) .. '|' .. tostring(_msg) .. '|' .. tostring(_err)").split("|")[:2])


@pytest.mark.parametrize("fields,gpu_hours", [
    ({"tres_per_task": "gres:gpu:8", "num_tasks": 1}, "1.33"),                 # --gpus-per-task=8
    ({"tres_per_task": "gres:gpu:1", "ntasks_per_node": 8}, "1.33"),           # --gpus-per-task=1 --ntasks-per-node=8
    ({"tres_per_task": "gres:gpu:h100:2", "num_tasks": 4}, "1.33"),
    ({"tres_per_socket": "gres:gpu:4", "sockets_per_node": 2}, "1.33"),        # --gpus-per-socket=4
    ({"tres_per_socket": "gres:gpu:4"}, "0.67"),                               # sockets unknown: at least one
    ({"tres_per_job": "gres:gpu:h100:4"}, "0.67"),                             # --gpus=h100:4
    ({"tres_per_node": "gres:gpu:1", "min_nodes": 4}, "0.67"),                 # --gres=gpu:1 -N 4
    ({"tres_per_node": "gres/gpu:h100=8"}, "1.33"),
    ({"tres_per_node": "gpu:8"}, "1.33"),
    ({"tres_per_node": "gres:gpu:1", "array_inx": "0-9%2"}, "1.67"),           # an array: every task
    ({"tres_per_node": "gres:gpu:1", "array_inx": "1,3,5-9:2"}, "0.83"),
])
def test_every_gpu_form_is_counted(lua, fields, gpu_hours):
    rc, msg = submit(lua, **fields)
    assert rc == "-1" and msg.endswith(f"this job may use {gpu_hours} GPU-hours"), (rc, msg)
    assert msg.startswith(f"user {USER} in account research: budget 1.00 GPU-hours for test, 0.50 GPU-hours left")


@pytest.mark.parametrize("fields", [
    {"tres_per_node": "gres:gpu:1"}, {"tres_per_node": "gpu"}, {"tres_per_node": "gres:gpu"},
    {"tres_per_task": "gres:gpu:1", "num_tasks": 3}, {"tres_per_node": "gres:shard:8"}, {},
    {"tres_per_node": "gres:gpu:8", "time_limit": NO_VAL},       # no time limit: Slurm's GrpTRESMins decides
    {"tres_per_node": "gres:gpu:8", "account": "other"},
])
def test_jobs_that_fit_pass(lua, fields):
    assert submit(lua, **fields) == ("0", "nil")


def test_no_time_limit_takes_the_partitions_default_or_max(lua):
    """A job without -t gets its partition's DefaultTime (else MaxTime): counted with that."""
    parts = ("{gpu = {name = 'gpu', default_time = 60, max_time = 4294967295, flag_default = 1}, "
             "cpu = {name = 'cpu', default_time = 4294967294, max_time = 120, flag_default = 0}}")
    rc, msg = submit(lua, parts, tres_per_node="gres:gpu:1", time_limit=NO_VAL)
    assert rc == "-1" and msg.endswith("this job may use 1.00 GPU-hours"), msg
    rc, msg = submit(lua, parts, tres_per_node="gres:gpu:1", time_limit=NO_VAL, partition=None)   # the default one
    assert rc == "-1" and msg.endswith("this job may use 1.00 GPU-hours"), msg
    rc, msg = submit(lua, parts, tres_per_node="gres:gpu:1", time_limit=NO_VAL, partition="cpu")   # MaxTime
    assert rc == "-1" and msg.endswith("this job may use 2.00 GPU-hours"), msg
    unlimited = "{gpu = {name = 'gpu', default_time = 4294967294, max_time = 4294967295, flag_default = 1}}"
    assert submit(lua, unlimited, tres_per_node="gres:gpu:1", time_limit=NO_VAL) == ("0", "nil")


JOB_REC = {"job_id": 77, "account": "research", "partition": "gpu", "user_name": USER, "time_limit": 10,
           "min_nodes": 1, "tres_per_node": "gres:gpu:h100:1", "tres_req_str": "cpu=1,mem=1000M,node=1,gres/gpu=1"}
NO_CHANGE = {"min_nodes": NO_VAL, "num_tasks": NO_VAL, "ntasks_per_node": NO_VAL16, "sockets_per_node": NO_VAL16,
             "time_limit": NO_VAL}


def modify(lua: Lua, uid: int = 1000, **fields) -> tuple[str, str]:
    desc = {**NO_CHANGE, **fields}
    return tuple(lua.run(f"_msg = nil; local rc = slurm_job_modify({_table(desc)}, {_table(JOB_REC)}, {{}}, {uid}); "
                         f"return tostring(rc) .. '|' .. tostring(_msg)").split("|"))


@pytest.mark.parametrize("fields", [
    {"tres_per_node": "gres:gpu:h100:8"},          # scontrol update JobId=77 Gres=gpu:h100:8
    {"min_nodes": 4},                              # NumNodes=4
    {"tres_per_task": "gres:gpu:4", "num_tasks": 2},
    {"tres_per_job": "gres:gpu:8"},
])
def test_an_update_enlarging_a_pending_job_is_held_to_the_budget(lua, fields):
    rc, msg = modify(lua, **fields)
    assert rc == "-1" and "this job may use" in msg, (rc, msg)
    assert modify(lua, uid=0, **fields) == ("0", "nil")          # the administrator's update is theirs


def test_updates_that_do_not_enlarge_pass(lua):
    assert modify(lua) == ("0", "nil")                           # e.g. a new name
    assert modify(lua, time_limit=5) == ("0", "nil")
    assert modify(lua, tres_per_node="gres:gpu:h100:2") == ("0", "nil")   # 20 GPU-minutes still fit


# ---------------------------------------------------------------- the running cluster
@pytest.fixture()
def user_budget(hostile):
    """A per-user budget for the throwaway user only (0.5 GPU-hours left) in the snapshot the
    installed script reads; the snapshot as it was is put back afterwards."""
    path = budget.snapshot_path()
    before = path.read_bytes() if path.exists() else None
    line = f"budget\tresearch\t{hostile.name}\tgpu_hours\ttest\t0\t1.00\t0.50\n"
    path.write_text((before or b"").decode() + line)
    try:
        yield
    finally:
        if before is None:
            path.unlink(missing_ok=True)
        else:
            path.write_bytes(before)


def test_the_installed_script_is_this_checkouts():
    assert (budget.snapshot_path().parent / "job_submit.lua").read_text() == SCRIPT.read_text(), \
        "run `bash scripts/cluster.sh up` to install slurm-conf/job_submit.lua"


@pytest.mark.parametrize("args", [
    ["-n", "1", "--gpus-per-task=8"],
    ["-N", "1", "--sockets-per-node=2", "--gpus-per-socket=4"],
    ["--gpus=4"],
    ["--gres=gpu:1", "--array=0-9"],
    ["-N", "4", "--gres=gpu:h100:1"],
])
def test_plain_sbatch_over_budget_is_refused(hostile, user_budget, args):
    r = hostile.run(["sbatch", "--parsable", "-H", "-A", "research", "-p", "gpu", "-t", "10", "-o", "/dev/null",
                     *args, "--wrap", "true"])
    if r.returncode == 0:
        hostile.jobs.append(r.stdout.strip().split(";")[0])
    assert r.returncode != 0 and f"user {hostile.name} in account research: budget 1.00 GPU-hours" in r.stderr, \
        (args, r.stdout, r.stderr)


def test_scontrol_update_enlarging_a_pending_job_is_refused(hostile, user_budget):
    from gpuhpc.slurm.client import SlurmClient

    job = hostile.sbatch("-H", "-A", "research", "-p", "gpu", "-t", "10", "-o", "/dev/null", "--gres=gpu:h100:1",
                         "--wrap", "true")
    client = SlurmClient()
    before = client.show_job(job)
    # Slurm 22.05 shows the user no log_user message on modify: the job_submit plugin's refusal
    # reaches scontrol as "Unspecified error" (a permission refusal reads "Access/permission
    # denied", a bad field "Invalid ..."), and slurmctld's log says why: the budget, in words
    log = Path(client.config()["SlurmctldLogFile"])
    start = log.stat().st_size
    reason = f"user {hostile.name} in account research: budget 1.00 GPU-hours for test, 0.50 GPU-hours left"
    for update, need in ((["Gres=gpu:h100:8"], "1.33"), (["NumNodes=4"], "0.67"), (["TresPerNode=gres:gpu:8"], "1.33")):
        r = hostile.run(["scontrol", "update", f"JobId={job}", *update])
        assert (r.returncode, r.stdout, r.stderr) == (1, "", f"Unspecified error for job {job}\n"), update
        line = (f"gpuhpc budget: refused an update of job {job} by uid {hostile.uid}: {reason}; "
                f"this job may use {need} GPU-hours")

        def logged(line=line):
            with log.open("rb") as fh:
                fh.seek(start)
                return line in fh.read().decode(errors="replace")
        wait_for(logged, 10, lambda line=line: f"slurmctld's log ({log}) to say {line!r}")
        start = log.stat().st_size
    after = client.show_job(job)
    assert {k: after.get(k) for k in ("TresPerNode", "NumNodes", "TimeLimit", "JobState")} == \
        {k: before.get(k) for k in ("TresPerNode", "NumNodes", "TimeLimit", "JobState")}
    # a shrinking update still works
    r = hostile.run(["scontrol", "update", f"JobId={job}", "TimeLimit=5"])
    assert r.returncode == 0, r.stderr
