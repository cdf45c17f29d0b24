"""A real multi-host deploy of gpuhpc.cluster (see conftest.py): systemd service mode, real SSH."""
from __future__ import annotations

import secrets
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from gpuhpc.jobs.render import render
from gpuhpc.jobs.spec import JobSpec, Resources
from polling import wait_for

from .conftest import LAB_DIR, REPO, SHARED, Lab, recap

pytestmark = pytest.mark.integration

DAEMONS = {"ctl": ["munge", "mariadb", "slurmdbd", "slurmctld"], "c1": ["munge", "slurmd"],
           "c2": ["munge", "slurmd"], "login": ["munge", "slurmctld"]}   # login: the backup controller


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
    wait_for(lambda: "c[1-2]|COMPLETED" in lab.ssh("ctl", "sacct -naX -P -o JobID,NodeList,State -S now-1hour"),
             60, "the srun job in slurmdbd's accounting")


def test_a_job_gets_slurmds_memlock_limit_not_the_login_shells(lab: Lab):
    # PropagateResourceLimitsExcept=MEMLOCK: the login shell's small memlock does not reach the job,
    # which gets slurmd's (its unit says unlimited; here it stays at this machine's 8 MiB hard limit,
    # which the lab's hosts cannot raise without CAP_SYS_RESOURCE); the other limits come from the shell
    assert "LimitMEMLOCK=infinity" in lab.ssh("c1", "systemctl show --property LimitMEMLOCK slurmd")
    slurmd = lab.ssh("c1", "awk '/^Max locked memory/ {print $4}' /proc/$(pidof slurmd)/limits").strip()
    want = slurmd if slurmd == "unlimited" else str(int(slurmd) // 1024)
    assert want != "1024"
    out = lab.ssh("login", "ulimit -l 1024; ulimit -S -n 1000; srun --nodes=1 --nodelist=c1 sh -c 'ulimit -l; ulimit -S -n'")
    assert out.split() == [want, "1000"], out


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
        # the job's /tmp: BasePath/JOB/.JOB (22.05), BasePath/JOB/.JOB/_tmp (24.11)
        tmp = f"{base}/.{j}/_tmp" if lab.ssh("c1", f"ls -A {base}/.{j}").split() == ["_tmp"] else f"{base}/.{j}"
        assert lab.ssh("c1", f"cat {tmp}/x; cat {tmp}/gpuhpc-{j}/y").split() == [j, j]
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
    changed = [line for line in proc.stdout.splitlines() if line.startswith(("TASK [", "RUNNING HANDLER", "changed:"))]
    changed = [t for t, nxt in zip(changed, changed[1:]) if nxt.startswith("changed:") and not t.startswith("changed:")]
    assert {h: r["changed"] for h, r in rows.items()} == {h: 0 for h in DAEMONS}, changed


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


ORDER_JOB = """#!/bin/bash
#SBATCH --nodelist={host} --time=30 --output=/shared/order/%j.out
touch /shared/order/$SLURM_JOB_ID.started
while [ ! -e /shared/order/release ]; do sleep 0.2; done
"""


# changes to the lab's cluster spec: a node feature (a node-definition change: slurmctld and slurmd
# restart) and a default memory per CPU (scontrol reconfigure)
NEW_FEATURE = ("    memory_mb: 2000\n", "    memory_mb: 2000\n    features: [lab-order]\n")
NEW_DEF_MEM = ("def_mem_per_cpu: 500", "def_mem_per_cpu: 600")


def _lab_spec(tmp_path: Path, *changes: tuple[str, str]) -> Path:
    """The lab's cluster spec (ansible/inventories/lab/cluster.yaml) with the changes made, as a file."""
    text = (REPO / "ansible/inventories/lab/cluster.yaml").read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    spec = tmp_path / "cluster.yaml"
    spec.write_text(text)
    return spec


def _node_states(lab: Lab) -> dict[str, str]:
    return dict(line.split() for line in lab.ssh("ctl", "sinfo --noheader --Node --format '%N %t'").splitlines())


def _until_task_after(play: subprocess.Popen, task: str) -> str:
    """The play's output up to the header of the task after ``task`` (every host has then reported
    ``task``: the linear strategy starts a task once all hosts finished the one before)."""
    seen, past = [], False
    for line in play.stdout:
        seen.append(line)
        if line.startswith("TASK ["):
            if past:
                break
            past = task in line
    return "".join(seen)


# The next two tests share their plays (they were five full plays): a check run during which c2 is
# stopped, then one real run that changes the node definitions under running jobs, brings c2 back and
# installs a new munge key. Each claim keeps its assertions.

def test_check_diff_shows_a_spec_change_and_changes_nothing_while_a_host_is_stopped_mid_play(lab: Lab, tmp_path):
    spec = _lab_spec(tmp_path, NEW_DEF_MEM)
    play = lab.popen_play("--check", "--diff", "-e", f"gpuhpc_slurm_common_spec={spec}",
                          "-e", "gpuhpc_slurm_compute_start_timeout=120")
    watchdog = threading.Timer(900, play.kill)
    watchdog.start()
    try:
        # once every host has shown its slurm.conf diff, stop c2 (SIGKILL to its PID 1: every process
        # of the host ends); the next test's run brings it back
        out = _until_task_after(play, "Render Slurm config files from the slurm-conf templates")
        lab.sh("down", "c2")
        out += play.stdout.read()
        play.wait()
    finally:
        watchdog.cancel()
        if play.poll() is None:
            play.kill()
    rows = recap(out)
    assert set(rows) == set(DAEMONS), out[-3000:]
    assert rows["c2"]["unreachable"] + rows["c2"]["failed"] >= 1, out[-3000:]
    # the play went on with the other hosts
    assert all(rows[h]["failed"] == 0 and rows[h]["unreachable"] == 0 for h in ("ctl", "login", "c1")), \
        "\n".join(_failed_tasks(out)) + out[-3000:]
    assert "-DefMemPerCPU=500" in out and "+DefMemPerCPU=600" in out
    # the spec change is a slurm.conf change: on ctl and login; c1 and c2 are configless, nothing is
    # copied to them (test_lab_configless.py)
    assert all(rows[h]["changed"] >= 1 for h in ("ctl", "login")) and rows["c1"]["changed"] == 0, rows
    lab.sh("up", "c2")
    for host in DAEMONS:   # c1 and c2 are configless: the slurm.conf their slurmd fetched
        path = "/var/spool/slurmd/conf-cache/slurm.conf" if host in ("c1", "c2") else "/etc/slurm/slurm.conf"
        assert "DefMemPerCPU=500" in lab.ssh(host, f"cat {path}"), host


def test_a_node_definition_change_keeps_running_jobs_brings_a_stopped_host_back_and_restarts_munged_for_a_new_key(
        lab: Lab, tmp_path):
    # jobs on both compute hosts (c2 just booted after the test above: it takes jobs again by itself)
    work = SHARED / "order"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    jobs = [lab.sbatch(ORDER_JOB.format(host=h)) for h in ("c1", "c2")]
    wait_for(lambda: all((work / f"{j}.started").exists() for j in jobs), 120, f"jobs {jobs} to start")
    before = {h: _main_pid(lab, h, "munge") for h in DAEMONS}
    key = tmp_path / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o600)
    # a new node feature: slurm.conf's NodeName lines change, which restarts slurmctld and slurmd;
    # and a new munge key, which restarts munged
    spec = _lab_spec(tmp_path, NEW_FEATURE)
    proc = lab.timed("order_play_s", lab.play, "-e", f"gpuhpc_slurm_common_spec={spec}",
                     "-e", f"gpuhpc_munge_key_src={key}")
    # the site's key is now this one: later runs (without -e) copy it from the first host
    (LAB_DIR / "secrets" / "munge.key").write_bytes(key.read_bytes())
    assert proc.returncode == 0, "\n".join(_failed_tasks(proc.stdout)) + proc.stdout[-3000:]
    out = proc.stdout
    # slurmd stopped on both hosts before slurmctld restarted, then came back on both at once, checked
    stop = out.index("TASK [Stop slurmd where slurmctld and slurmd both restart]")
    ctld = out.index("TASK [gpuhpc.cluster.gpuhpc_slurm_controller : Restart slurmctld for a restart-class change (systemd)]")
    start = out.index("TASK [gpuhpc.cluster.gpuhpc_slurm_compute : Restart slurmd, or start it where this change stopped it")
    check = out.index("TASK [gpuhpc.cluster.gpuhpc_slurm_compute : Check that no node of the change drained or went invalid]")
    assert stop < ctld < start < check
    assert "changed: [c1]" in out[stop:ctld] and "changed: [c2]" in out[stop:ctld]
    assert "changed: [c1]" in out[start:check] and "changed: [c2]" in out[start:check]
    # no node drained or invalid, the jobs still run, and the nodes carry the new feature
    states = _node_states(lab)
    assert set(states) == {"c1", "c2"} and all(st in ("alloc", "mix") for st in states.values()), states
    assert [lab.job_state(j) for j in jobs] == ["RUNNING", "RUNNING"]
    assert "AvailableFeatures=lab-order" in lab.ssh("ctl", "scontrol show node c1")
    # the host stopped mid-play is back: its slurmd runs under systemd
    assert lab.ssh("c2", "systemctl is-active slurmd").strip() == "active"
    # munged restarted on every host through the handlers: systemd started it, the new munged is the
    # unit's main process, in the unit's cgroup
    assert "RUNNING HANDLER [gpuhpc.cluster.gpuhpc_munge : Restart munged]" in out
    for host in DAEMONS:
        after = _main_pid(lab, host, "munge")
        assert after not in ("0", before[host]), host
        assert lab.ssh(host, f"grep name=systemd /proc/{after}/cgroup").strip().endswith("/system.slice/munge.service")
    # the cluster works with the new key everywhere, c2 included, beside the running jobs
    srun = lab.ssh("login", "srun --nodes=2 --label hostname", timeout=120)
    assert sorted(line.split(": ")[1] for line in srun.split("\n") if line) == ["c1", "c2"]
    (work / "release").touch()
    wait_for(lambda: all(lab.job_state(j) == "COMPLETED" for j in jobs), 90, f"jobs {jobs} to complete")
    # the cluster keeps this spec: the plays below load the spec only for its version and
    # controllers (upgrade) or check the state directory (test_lab_ha.py)


def test_a_rebooted_compute_host_comes_back_idle_without_ansible(lab: Lab):
    # a power cut and a boot of c1's systemd: slurmd is an enabled unit and /run/slurm comes back
    # from tmpfiles.d; ReturnToService=2 takes the node back when it registers
    booted = lab.ssh("c1", "ps -o lstart= -p 1")
    lab.sh("down", "c1")
    lab.sh("up", "c1")
    assert lab.ssh("c1", "ps -o lstart= -p 1") != booted      # a new systemd
    wait_for(lambda: _node_states(lab).get("c1") == "idle", 90, "c1 to come back idle")
    assert lab.ssh("c1", "systemctl is-active munge slurmd").split() == ["active", "active"]
    # slurmd came up after its scratch, through its start check (gpuhpc_nvme_scratch's drop-in)
    assert "/scratch" in lab.ssh("c1", "systemctl show --property RequiresMountsFor --value slurmd").split()
    assert "gpuhpc-slurmd-precheck c1 dir:/scratch" in lab.ssh("c1", "systemctl cat slurmd")
    out = lab.ssh("login", "srun --nodes=2 --label hostname", timeout=120)
    assert sorted(line.split(": ")[1] for line in out.split("\n") if line) == ["c1", "c2"]


def test_the_upgrade_playbook_dumps_the_database_then_moves_dbd_ctld_and_drained_slurmd(lab: Lab):
    # the same version (the lab has one): it proves the order, the dump, the holds and the drains
    version = lab.ssh("c1", "dpkg-query --show --showformat '${Version}' slurmd").strip()
    work = SHARED / "upgrade"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    job = lab.sbatch(ORDER_JOB.replace("/shared/order", "/shared/upgrade").format(host="c1"))
    wait_for(lambda: (work / f"{job}.started").exists(), 90, f"job {job} to start")
    proc = lab.timed("upgrade_play_s", lab.play, "-e", f"gpuhpc_slurm_common_version={version}",
                     playbook="gpuhpc.cluster.upgrade")
    assert proc.returncode == 0, "\n".join(_failed_tasks(proc.stdout)) + proc.stdout[-3000:]
    out = proc.stdout
    plays = [out.index(f"PLAY [{name}") for name in ("Accounting first", "Backup controllers", "Primary controller",
                                                     "Compute hosts in drained batches", "Login hosts")]
    assert plays == sorted(plays)
    drain = out.index("TASK [Drain this batch")
    assert out.index("TASK [Dump the accounting database]") < drain < out.index("TASK [Resume the nodes this play drained]")
    assert int(lab.ssh("ctl", f"zcat /var/backups/gpuhpc/*-before-{version}.sql.gz | grep -c 'CREATE TABLE'")) > 10
    for host, pkgs in {"ctl": ["slurm-client", "slurmctld", "slurmdbd"], "c1": ["slurm-client", "slurmd"],
                       "login": ["slurm-client"]}.items():
        assert set(pkgs) <= set(lab.ssh(host, "apt-mark showhold").split()), host
    # the nodes are back in service, none keeps the play's drain, and the running job went on
    assert _node_states(lab) == {"c1": "mix", "c2": "idle"}
    assert "gpuhpc upgrade" not in lab.ssh("ctl", "sinfo --noheader --list-reasons")
    assert lab.job_state(job) == "RUNNING"
    (work / "release").touch()
    wait_for(lambda: lab.job_state(job) == "COMPLETED", 90, f"job {job} to complete")
