"""The SSH transport against a real sshd (scripts/services/sshd.sh) and the real cluster:
the same SlurmClient code path a laptop uses to reach a login node."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc.errors import TransportError
from gpuhpc.slurm import SlurmClient
from gpuhpc.transport.ssh import SSHRunner
from polling import wait_for

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ssh_env() -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts/services/sshd.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    env = dict(kv.split("=", 1) for kv in out.split())
    return {
        "GPUHPC_SSH_HOST": env["GPUHPC_TEST_SSH_HOST"],
        "GPUHPC_SSH_KEY": env["GPUHPC_TEST_SSH_KEY"],
        "GPUHPC_SSH_KNOWN_HOSTS": env["GPUHPC_TEST_SSH_KNOWN_HOSTS"],
        **({"GPUHPC_SSH_SLURM_CONF": os.environ["SLURM_CONF"]} if os.environ.get("SLURM_CONF") else {}),
    }


@pytest.fixture()
def client(ssh_env) -> SlurmClient:
    runner = SSHRunner.from_env(ssh_env)
    yield SlurmClient(runner)
    runner.close()


def test_reads_cluster_over_ssh(client):
    names = {n.name for n in client.nodes()}
    assert {"gpu-node1", "mig-node1"} <= names
    assert client.version[0] >= 22


def test_submit_hostile_name_over_ssh_is_quoted(client, tmp_path):
    marker = Path("/var/tmp/gpuhpc-ssh-pwned")
    marker.unlink(missing_ok=True)
    out = tmp_path / "out.txt"
    script = "#!/bin/bash\necho \"name=$SLURM_JOB_NAME\"\n"
    job_id = client.submit_script(script, extra=["--job-name", "x; touch /var/tmp/gpuhpc-ssh-pwned",
                                                 "--partition", "cpu", "--output", str(out), "--time", "5"],
                                  script_dir=str(tmp_path / "scripts"))
    try:
        def finished():
            rows = client.queue(job_ids=[job_id])
            return not rows or rows[0].state.is_finished
        wait_for(finished, 90, f"job {job_id} to finish", interval=1)
        assert out.exists(), "job did not run"
        assert "name=x; touch /var/tmp/gpuhpc-ssh-pwned" in out.read_text()
        assert not marker.exists()
        assert list((tmp_path / "scripts").glob("gpuhpc-*.sbatch")), "script not written over SFTP"
    finally:
        client.cancel(job_id)


def test_unknown_host_key_is_rejected(ssh_env, tmp_path):
    env = {**ssh_env, "GPUHPC_SSH_KNOWN_HOSTS": str(tmp_path / "empty_known_hosts")}
    runner = SSHRunner.from_env(env)
    with pytest.raises(TransportError):
        runner.run(["true"])


def test_cli_over_ssh(ssh_env, cmd_client):
    env = {**os.environ, **ssh_env}
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "cluster", "status", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "gpu-node1" in res.stdout
    # the same through the compiled client and its command server (a laptop's usual gpuhpc)
    via_server = cmd_client.run("cluster", "status", "--json", env=ssh_env)
    assert via_server.returncode == 0, via_server.stderr
    assert "gpu-node1" in via_server.stdout


def test_submit_jobs_and_logs_through_the_cli_over_ssh(ssh_env, tmp_path):
    """The researcher's laptop path: gpuhpc submit / jobs / logs with GPUHPC_SSH_HOST set."""
    env = {**os.environ, **ssh_env, "GPUHPC_LEDGER": "off"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuhpc", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=120)
    res = run("submit", "--partition", "cpu", "--time", "15m", "--name", "ssh-demo; id",
              "--log-dir", str(tmp_path), "--checkpoint-dir", str(tmp_path / "ckpt"), "--json",
              "--", "echo", "hello from $(hostname)")
    assert res.returncode == 0, res.stderr
    job_id = json.loads(res.stdout)["job_id"]
    try:
        def finished():
            st = run("status", job_id, "--json")
            return st.returncode == 0 and json.loads(st.stdout)["state"] in ("COMPLETED", "FAILED", "CANCELLED")
        wait_for(finished, 90, lambda: f"job {job_id} to finish (status now: {run('status', job_id, '--json').stdout.strip()})",
                 interval=1)
        logs = run("logs", job_id)
        assert logs.returncode == 0, logs.stderr
        assert "hello from $(hostname)" in logs.stdout      # the argument reached the program verbatim
        jobs = run("jobs", "--json")
        assert jobs.returncode == 0, jobs.stderr
    finally:
        run("cancel", job_id)


def test_read_from_over_sftp_returns_only_new_bytes(client, tmp_path):
    """`gpuhpc logs -f` over SSH: each poll reads from the last offset, not the whole file."""
    log = tmp_path / "growing.out"
    assert client.runner.read_from(str(log), 0) == b""          # not there yet
    log.write_bytes(b"first\n")
    assert client.runner.read_from(str(log), 0) == b"first\n"
    with log.open("ab") as fh:
        fh.write(b"second\n")
    assert client.runner.read_from(str(log), 6) == b"second\n"
    assert client.runner.read_from(str(log), 13) == b""


def test_logs_follow_over_ssh(ssh_env, tmp_path):
    env = {**os.environ, **ssh_env, "GPUHPC_LEDGER": "off"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "gpuhpc", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=180)
    res = run("submit", "--partition", "cpu", "--time", "5m", "--name", "ssh-follow", "--log-dir", str(tmp_path),
              "--", "bash", "-c", "for i in $(seq 1 10); do echo line $i; sleep 0.3; done")
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    try:
        follow = run("logs", "-f", job_id)
        assert follow.returncode == 0, follow.stderr
        assert [ln for ln in follow.stdout.splitlines() if ln.startswith("line ")] == [
            f"line {i}" for i in range(1, 11)]
    finally:
        run("cancel", job_id)


def test_node_inventory_asks_the_node_over_ssh(ssh_env, fixtures_dir, tmp_path):
    """nvidia-smi, hostname and the CPU count come through the runner (the node's, over SSH), never
    from a check of this host's PATH: a stand-in nvidia-smi that only the remote PATH has."""
    from gpuhpc.cli.node import _live, _node_name

    F = fixtures_dir / "nvidia-smi"
    fake = tmp_path / "remote-bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text(f"""#!/bin/sh
case "$*" in
  "-q -x") cat {F / 'q-text-h100-sxm-8gpu-535.183.01.txt'} ;;
  "topo -m") cat {F / 'topo-m-dgx-a100.txt'} ;;
  "-L") cat {F / 'L-h100-80gb-mig-mixed.txt'} ;;
  *) exit 9 ;;
esac
""")
    (fake / "nvidia-smi").chmod(0o755)
    runner = SSHRunner.from_env(ssh_env)
    runner.env["PATH"] = f"{fake}:/usr/local/bin:/usr/bin:/bin"
    try:
        texts = _live(runner)
        assert set(texts) == {"xml", "topo", "list"} and "GPU 0" in texts["list"][0]
        assert _node_name(runner) == subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    finally:
        runner.close()


def test_node_inventory_without_nvidia_smi_on_the_node_is_bad_input(ssh_env):
    env = {**os.environ, **ssh_env}
    proc = subprocess.run([sys.executable, "-m", "gpuhpc", "node", "inventory"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "nvidia-smi not found" in proc.stderr
