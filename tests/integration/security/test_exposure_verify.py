"""Issue 39 (hostile user), what a site must fix itself, said by gpuhpc_hardening's verify step:

- **Slurm's ports on every interface with no firewall.** The local spec sets no management network,
  so the role writes no nftables rules, and slurmctld, slurmd and slurmdbd bind the wildcard address
  (Slurm has no bind setting): a throwaway user reaches slurmctld's port through this host's
  non-loopback address. Verify now names each Slurm port open beyond the loopback and fails, unless
  the site accepted it (``gpuhpc_hardening_allow_open_slurm_ports``: the local inventory does, and
  verify still names them).
- **Job scratch on the controller's filesystem with no quota.** The throwaway user writes to /var/tmp
  and the job scratch, on the same filesystem as slurmctld's StateSaveLocation and slurmdbd's
  database, with no quota: filling it would stop both. Verify names each such pair (the paths, the
  mount) and fails, unless accepted (``gpuhpc_hardening_allow_shared_state_filesystem``).

The role's verify tasks run against this machine (connection local, read only: ss and findmnt), with
the local cluster's ports and paths read from its slurm.conf and slurmdbd.conf."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SLURM_CONF = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
SCRATCH = "/var/lib/gpuhpc/scratch"           # the local inventory's gpuhpc_nvme_scratch_mount (job scratch)

PLAY = """\
- name: gpuhpc_hardening's verify on this machine
  hosts: ctl
  gather_facts: false
  tasks:
    - name: The role's verify tasks
      ansible.builtin.include_role:
        name: gpuhpc.cluster.gpuhpc_hardening
        tasks_from: verify.yml
"""


def _conf() -> dict:
    """gpuhpc_slurm_common_conf's parts verify reads, from the local cluster's running configuration."""
    kv = {}
    ports = []
    for line in SLURM_CONF.read_text().splitlines():
        if line.startswith("NodeName=") and (m := re.search(r"\bPort=(\d+)", line)):
            ports.append({"port": int(m.group(1))})
        elif "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            kv[k.strip()] = v.strip()
    dbd = dict(line.split("=", 1) for line in (SLURM_CONF.parent / "slurmdbd.conf").read_text().splitlines()
               if "=" in line and not line.startswith("#"))
    return {"slurmctld_port": int(kv["SlurmctldPort"]), "slurmd_port": int(kv["SlurmdPort"]),
            "accounting": {"port": int(dbd["DbdPort"])}, "nodes": ports,
            "state_save_location": kv["StateSaveLocation"], "management_networks": []}


def _verify(tmp: Path, **extra) -> subprocess.CompletedProcess:
    tmp.mkdir()
    (tmp / "play.yml").write_text(PLAY)
    (tmp / "hosts.ini").write_text("[slurm_controller]\nctl\n[slurmdbd]\nctl\n")
    (tmp / "extra.json").write_text(json.dumps({"gpuhpc_slurm_common_conf": _conf(), "gpuhpc_hardening_ssh_no_passwords": False,
                                                "gpuhpc_nvme_scratch_mount": SCRATCH, **extra}))
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),
                "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible-tmp"), "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1",
                "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"})
    return subprocess.run([str(venv_bin / "ansible-playbook"), "-i", str(tmp / "hosts.ini"), str(tmp / "play.yml"),
                           "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}",
                           "-e", f"@{tmp / 'extra.json'}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _outside_address() -> str:
    """This host's first address that is not the loopback (what another host would connect to)."""
    words = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=30).stdout.split()
    v4 = [w for w in words if "." in w and not w.startswith("127.")]
    assert v4, f"no non-loopback IPv4 address here: {words}"
    return v4[0]


def test_slurm_ports_open_beyond_the_loopback_are_named_and_refused_by_verify(hostile, tmp_path):
    conf = _conf()
    addr = _outside_address()
    probe = hostile.run(["bash", "-c", f'exec 3<>/dev/tcp/{addr}/{conf["slurmctld_port"]} && echo reached'], timeout=30)
    assert probe.stdout.strip() == "reached", probe.stderr           # the exposure itself, as an ordinary user
    refused = _verify(tmp_path / "a")
    out = refused.stdout
    assert refused.returncode != 0, out[-3000:]
    assert "MISSING: a firewall. Slurm's ports listen beyond the loopback (" in out, out[-3000:]
    for port in (conf["slurmctld_port"], conf["accounting"]["port"], conf["nodes"][0]["port"]):
        assert re.search(rf"[^ (]+:{port}\b", out.split("MISSING: a firewall.", 1)[1].split(")", 1)[0]), (port, out[-3000:])
    assert "set the spec's management_networks" in out and "gpuhpc_hardening_allow_open_slurm_ports: true" in out
    assert "Slurm's ports open with no firewall" in out, out[-3000:]
    accepted = _verify(tmp_path / "b", gpuhpc_hardening_allow_open_slurm_ports=True,
                       gpuhpc_hardening_allow_shared_state_filesystem=True)
    assert accepted.returncode == 0, accepted.stdout[-3000:]
    assert "MISSING: a firewall." in accepted.stdout                # still said, where accepted


def test_job_scratch_on_the_controllers_filesystem_without_a_quota_is_named_by_verify(hostile, tmp_path):
    state = _conf()["state_save_location"]
    wrote = hostile.run(["bash", "-c", 'f=$(mktemp -p /var/tmp) && echo "$f" && rm -f "$f"'], timeout=30)
    assert wrote.returncode == 0, wrote.stderr                          # any user fills /var/tmp
    for path in ("/var/tmp", SCRATCH):                                  # (jobs' /tmp and /dev/shm live in SCRATCH)
        assert os.stat(path).st_dev == os.stat(state).st_dev, path
    refused = _verify(tmp_path / "a", gpuhpc_hardening_allow_open_slurm_ports=True)
    out = refused.stdout
    assert refused.returncode != 0, out[-3000:]
    mount = subprocess.run(["findmnt", "-n", "-o", "TARGET", "-T", state], capture_output=True, text=True).stdout.strip()
    assert f"/var/tmp (users fill it) and {state} on {mount}, no quota" in out, out[-3000:]
    assert f"{SCRATCH} (users fill it) and {state} on {mount}, no quota" in out, out[-3000:]
    assert "/dev/shm (users fill it)" not in out                      # a filesystem of its own (tmpfs)
    assert "MISSING: a quota or a separate filesystem." in out and "job scratch shares a filesystem" in out
