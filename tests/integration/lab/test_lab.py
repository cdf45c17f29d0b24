"""A real multi-host deploy of gpuhpc.cluster (see conftest.py): systemd service mode, real SSH."""
from __future__ import annotations

import secrets
import shutil
import time

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from polling import wait_for

from .conftest import LAB_DIR, REPO, SHARED, Lab, recap

pytestmark = pytest.mark.integration

DAEMONS = {"ctl": ["munge", "mariadb", "slurmdbd", "slurmctld"], "c1": ["munge", "slurmd"],
           "c2": ["munge", "slurmd"], "login": ["munge"]}


def test_every_host_runs_systemd_as_pid1_and_the_daemons_are_active_units(lab: Lab):
    for host, units in DAEMONS.items():
        assert lab.ssh(host, "ps -o comm= -p 1").strip() == "systemd", host
        assert lab.ssh(host, f"hostname; systemctl is-active {' '.join(units)}").split() == [host] + ["active"] * len(units)
        assert lab.ssh(host, f"systemctl is-enabled {' '.join(units)}").split() == ["enabled"] * len(units)
    # the controller reached both slurmd over the management network
    assert lab.ssh("ctl", "sinfo --noheader --Node --format '%N %t'").split() == ["c1", "idle", "c2", "idle"]


def test_srun_from_the_login_host_spans_both_compute_hosts(lab: Lab):
    out = lab.ssh("login", "srun --nodes=2 --ntasks-per-node=1 --label hostname", timeout=120)
    assert sorted(line.split(": ")[1] for line in out.split("\n") if line) == ["c1", "c2"]
    # and the job is in slurmdbd's accounting (the controller host's MariaDB)
    deadline = time.monotonic() + 60
    while "c[1-2]|COMPLETED" not in (acct := lab.ssh("ctl", "sacct -naX -P -o JobID,NodeList,State -S now-1hour")):
        assert time.monotonic() < deadline, acct
        time.sleep(2)


# A job that writes /tmp/x and its $GPUHPC_SCRATCH, says it started, and holds until released;
# what it saw goes to /shared (a test never reads what a job wrote under /tmp)
PRIVATE_TMP_JOB = r"""
echo "$SLURM_JOB_ID" > /tmp/x && echo "$SLURM_JOB_ID" > "$GPUHPC_SCRATCH/y"
touch "/shared/jc/$SLURM_JOB_ID.started"
while [ ! -e /shared/jc/release ]; do sleep 0.2; done
{ cat /tmp/x; ls -A /tmp | tr '\n' ' '; echo; echo "$GPUHPC_SCRATCH"; } > "/shared/jc/$SLURM_JOB_ID.saw"
"""


def _job_dirs(lab: Lab, host: str, job_id: str) -> list[str]:
    """The job's directory under the host's BasePath (job_container/tmpfs)."""
    return lab.ssh(host, f"find /scratch/slurm-jobs -mindepth 1 -maxdepth 2 -name {job_id}").split()


def test_two_jobs_on_one_host_get_private_tmp_on_scratch_removed_after(lab: Lab):
    work = SHARED / "jc"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "job.sh").write_text(PRIVATE_TMP_JOB)
    spec = JobSpec(command=("bash", "/shared/jc/job.sh"), name="private-tmp",
                   resources=Resources(nodelist="c1", time="5m"), log_dir="/shared/jc", checkpoint_dir="/shared/jc/ck-%j")
    jobs = [lab.sbatch(render(spec)) for _ in range(2)]
    wait_for(lambda: all((work / f"{j}.started").exists() for j in jobs), 90, f"jobs {jobs} to start together on c1")
    for j in jobs:    # while it runs, the job's /tmp and $GPUHPC_SCRATCH are on the host's scratch mount
        [base] = _job_dirs(lab, "c1", j)
        assert lab.ssh("c1", f"cat {base}/.{j}/x; cat {base}/.{j}/gpuhpc-{j}/y").split() == [j, j]
    (work / "release").touch()
    wait_for(lambda: all(lab.job_state(j) == "COMPLETED" for j in jobs), 90, f"jobs {jobs} to complete")
    for j in jobs:
        x, listing, scratch = (work / f"{j}.saw").read_text().splitlines()
        assert x == j and listing.split() == [f"gpuhpc-{j}", "x"] and scratch == f"/tmp/gpuhpc-{j}"
    # gone after the job (slurmstepd removes it once the job's last step ends)
    wait_for(lambda: not any(_job_dirs(lab, "c1", j) for j in jobs), 30, "the jobs' scratch directories to go")


def test_a_second_run_reports_no_change(lab: Lab):
    proc = lab.timed("second_play_s", lab.play)
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = recap(proc.stdout)
    assert set(rows) == set(DAEMONS)
    assert {h: r["changed"] for h, r in rows.items()} == {h: 0 for h in DAEMONS}, proc.stdout[-4000:]


CONNECT = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], 0)); s.settimeout(5)
try:
    s.connect((sys.argv[2], int(sys.argv[3]))); print("connected")
except OSError as e:
    print(type(e).__name__)
"""


def _connect(lab: Lab, src: str, dst: str, port: int) -> str:
    return lab.sh("ctl", "python3", "-c", CONNECT, src, dst, str(port)).stdout.strip()


def test_slurm_ports_answer_the_management_network_only(lab: Lab):
    # the cluster's own traffic passes (the srun test above, and a fresh connection from 10.213.0.1) ...
    for host, port in [("13", 6818), ("14", 6818), ("11", 6817), ("11", 6819)]:
        assert _connect(lab, "10.213.0.1", f"10.213.0.{host}", port) == "connected", (host, port)
    # ... and from outside the management network (same wire, 10.213.1.0/24) slurmd refuses
    for host, port in [("13", 6818), ("14", 6818), ("11", 6817), ("11", 6819)]:
        assert _connect(lab, "10.213.1.1", f"10.213.1.{host}", port) == "ConnectionRefusedError", (host, port)
    # sshd still answers there (only Slurm's ports are restricted)
    assert _connect(lab, "10.213.1.1", "10.213.1.13", 22) == "connected"


def test_compute_ssh_takes_keys_only_and_users_without_a_job_are_refused(lab: Lab):
    assert "passwordauthentication no" in lab.ssh("c1", "sshd -T -C user=nobody,host=x,addr=10.213.0.1")
    lab.ssh("c1", "id alice >/dev/null 2>&1 || useradd -m alice; install -d -o alice -m 700 ~alice/.ssh;"
                  " install -o alice -m 600 /root/.ssh/authorized_keys ~alice/.ssh/authorized_keys")
    key = str(LAB_DIR / "id_ed25519")
    proc = lab.sh("ctl", "ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={LAB_DIR}/known_hosts",
                  "-i", key, "alice@10.213.0.13", "true", check=False)
    assert proc.returncode != 0
    assert "pam_slurm_adopt" in lab.ssh("c1", "journalctl --no-pager -o cat -u ssh | tail -20")


def test_check_diff_shows_a_spec_change_and_changes_nothing(lab: Lab, tmp_path):
    spec = tmp_path / "cluster.yaml"
    text = (REPO / "ansible/inventories/lab/cluster.yaml").read_text()
    spec.write_text(text.replace("def_mem_per_cpu: 500", "def_mem_per_cpu: 600"))
    proc = lab.play("--check", "--diff", "-e", f"gpuhpc_slurm_common_spec={spec}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "-DefMemPerCPU=500" in proc.stdout and "+DefMemPerCPU=600" in proc.stdout
    assert all(r["changed"] >= 1 for r in recap(proc.stdout).values())
    for host in DAEMONS:
        assert "DefMemPerCPU=500" in lab.ssh(host, "cat /etc/slurm/slurm.conf"), host


def _failed_tasks(out: str) -> list[str]:
    """Each failed task's header and its failure lines, from ansible-playbook's output."""
    lines, task, keep = out.splitlines(), "", []
    for line in lines:
        if line.startswith("TASK ["):
            task = line
        elif line.startswith(("fatal: ", "failed: ")):
            keep += [task, line[:2000]]
    return keep


def _main_pid(lab: Lab, host: str, unit: str) -> str:
    return lab.ssh(host, f"systemctl show --property MainPID --value {unit}").strip()


def test_a_new_munge_key_restarts_munged_through_systemd_handlers(lab: Lab, tmp_path):
    before = {h: _main_pid(lab, h, "munge") for h in DAEMONS}
    key = tmp_path / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    proc = lab.play("-e", f"gpuhpc_munge_key_src={key}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "RUNNING HANDLER [gpuhpc.cluster.gpuhpc_munge : Restart munged]" in proc.stdout
    for host in DAEMONS:
        after = _main_pid(lab, host, "munge")
        assert after not in ("0", before[host]), host
        # systemd started it: the new munged is the unit's main process, in the unit's cgroup
        assert lab.ssh(host, f"grep name=systemd /proc/{after}/cgroup").strip().endswith("/system.slice/munge.service")
    # the cluster works with the new key everywhere
    out = lab.ssh("login", "srun --nodes=2 --label hostname", timeout=120)
    assert sorted(line.split(": ")[1] for line in out.split("\n") if line) == ["c1", "c2"]
    # the site's key is now this one: later runs (without -e) copy it from the first host
    (LAB_DIR / "secrets" / "munge.key").write_bytes(key.read_bytes())


def test_a_compute_host_stopped_mid_play_rejoins_on_the_next_run(lab: Lab):
    play = lab.popen_play("-e", "gpuhpc_slurm_compute_start_timeout=120")
    try:
        # stop c2 (SIGKILL to its PID 1: every process of the host ends) while the play runs
        time.sleep(8)
        lab.sh("down", "c2")
        out, _ = play.communicate(timeout=900)
    finally:
        if play.poll() is None:
            play.kill()
    rows = recap(out)
    assert rows["c2"]["unreachable"] + rows["c2"]["failed"] >= 1, out[-3000:]
    assert rows["c1"]["failed"] == 0 and rows["ctl"]["failed"] == 0
    lab.sh("up", "c2")
    proc = lab.timed("rejoin_play_s", lab.play)
    assert proc.returncode == 0, "\n".join(_failed_tasks(proc.stdout)) + proc.stdout[-3000:]
    assert lab.ssh("c2", "systemctl is-active slurmd").strip() == "active"
    deadline = time.monotonic() + 90
    while "c2 idle" not in (state := lab.ssh("ctl", "sinfo --noheader --Node --format '%N %t'")) and time.monotonic() < deadline:
        time.sleep(2)
    assert "c2 idle" in state, state
    out = lab.ssh("login", "srun --nodes=2 --label hostname", timeout=120)
    assert sorted(line.split(": ")[1] for line in out.split("\n") if line) == ["c1", "c2"]

