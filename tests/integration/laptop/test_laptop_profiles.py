"""Cluster profiles and host keys against the real sshd: --cluster / GPUHPC_CLUSTER select the
runner of every command, ~/.ssh/config's ProxyJump is followed (to a login node that only the
jump host can reach), unknown and changed host keys
are refused (the first with the trust command), `gpuhpc cluster trust` pins a key."""
from __future__ import annotations

import base64
import json
import subprocess

import paramiko
import pytest

from gpuhpc.errors import TransportError
from gpuhpc.transport.ssh import SSHRunner, fingerprint


def test_cluster_option_and_env_select_the_profile(laptop):
    res = laptop.gpuhpc("--cluster", "lab", "cluster", "status", "--json")
    assert res.returncode == 0, res.stderr
    assert "gpu-node1" in res.stdout
    res = laptop.gpuhpc("jobs", "--json", env={"GPUHPC_CLUSTER": "lab"})
    assert res.returncode == 0, res.stderr
    json.loads(res.stdout)


def test_a_wrong_profile_name_lists_the_profiles(laptop):
    laptop.profile("other", host="127.0.0.2")
    for args, env in ((("--cluster", "lba", "jobs"), {}), (("jobs",), {"GPUHPC_CLUSTER": "lba"})):
        res = laptop.gpuhpc(*args, env=env)
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1 and "no cluster profile 'lba'" in res.stderr
        assert "profiles: lab, other" in res.stderr and "Traceback" not in res.stderr


def test_unreachable_host_is_one_line(laptop):
    laptop.profile("lab", port=1)
    res = laptop.gpuhpc("--cluster", "lab", "jobs")
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert "cannot connect" in res.stderr


def _behind(laptop, jump_host, tmp_path):
    """An ssh_config naming the login node by the name only the jump host resolves."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host behind\n  HostName {jump_host.target}\n  Port 2222\n  User {laptop.user}\n"
                   f"  IdentityFile {laptop.key}\n  ProxyJump {laptop.user}@127.0.0.1:{jump_host.port}\n")
    return cfg


def test_proxyjump_from_ssh_config(laptop, jump_host, tmp_path):
    cfg = _behind(laptop, jump_host, tmp_path)
    laptop.profile("jumped", host="behind", user=None, port=None, key=None)
    res = laptop.gpuhpc("--cluster", "jumped", "cluster", "status", "--json", env={"GPUHPC_SSH_CONFIG": str(cfg)})
    assert res.returncode == 0, res.stderr
    assert "gpu-node1" in res.stdout


def test_proxyjump_runner_goes_through_the_jump_host(laptop, jump_host, tmp_path):
    cfg = _behind(laptop, jump_host, tmp_path)
    direct = SSHRunner("behind", known_hosts=str(laptop.known_hosts), ssh_config=str(cfg), jump="none")
    with pytest.raises(TransportError, match="cannot connect"):      # not reachable but through the jump host
        direct.run(["true"])
    runner = SSHRunner("behind", known_hosts=str(laptop.known_hosts), ssh_config=str(cfg))
    try:
        assert runner.jump == f"{laptop.user}@127.0.0.1:{jump_host.port}"
        assert runner.run(["id", "-un"]).stdout.strip() == laptop.user
    finally:
        runner.close()


def test_unknown_key_names_the_trust_command_which_pins_it(laptop, sshd):
    laptop.known_hosts.write_text("")
    res = laptop.gpuhpc("--cluster", "lab", "jobs")
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    host_pub = open(sshd["GPUHPC_TEST_SSH_KNOWN_HOSTS"]).read().split()
    key = paramiko.Ed25519Key(data=base64.b64decode(host_pub[2]))
    fp = fingerprint(key)
    assert f"unknown host key ssh-ed25519 {fp}" in res.stderr
    assert "run: gpuhpc cluster trust lab" in res.stderr
    # a fingerprint that does not match is not trusted
    bad = laptop.gpuhpc("cluster", "trust", "lab", "--fingerprint", "SHA256:AAAA")
    assert bad.returncode == 1 and laptop.known_hosts.read_text() == ""
    # without a terminal it asks for --yes
    ask = laptop.gpuhpc("cluster", "trust", "lab", stdin=subprocess.DEVNULL)
    assert ask.returncode == 2 and fp in ask.stderr
    ok = laptop.gpuhpc("cluster", "trust", "lab", "--fingerprint", fp)
    assert ok.returncode == 0, ok.stderr
    assert fp in ok.stderr and "[127.0.0.1]:2222 ssh-ed25519 " in laptop.known_hosts.read_text()
    assert laptop.gpuhpc("--cluster", "lab", "jobs").returncode == 0


def test_a_changed_host_key_is_refused_loudly(laptop):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(laptop.config.parent / "k2")],
                   check=True)
    pub = (laptop.config.parent / "k2.pub").read_text().split()
    laptop.known_hosts.write_text(f"[127.0.0.1]:2222 {pub[0]} {pub[1]}\n")
    res = laptop.gpuhpc("--cluster", "lab", "jobs")
    assert res.returncode == 1 and res.stderr.count("\n") == 1, res.stderr
    assert "HOST KEY CHANGED" in res.stderr and "refusing to connect" in res.stderr
    trust = laptop.gpuhpc("cluster", "trust", "lab", "--yes")
    assert trust.returncode == 1 and "CHANGED" in trust.stderr
