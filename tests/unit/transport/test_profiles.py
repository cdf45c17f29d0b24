"""Cluster profiles ([clusters.NAME] in the user config) and ~/.ssh/config: where an SSHRunner
connects, decided without connecting."""
from __future__ import annotations

import pytest

from gpuhpc import config
from gpuhpc.errors import UserInputError
from gpuhpc.transport.ssh import SSHRunner, fingerprint, host_entry, runner_for, shared_runner


@pytest.fixture
def env(tmp_path):
    user = tmp_path / "config.toml"
    sshcfg = tmp_path / "ssh_config"
    sshcfg.write_text("Host big\n  HostName login.big.example.org\n  User alice\n  Port 2200\n"
                      "  IdentityFile /nonexistent/key\n  ProxyJump bob@bastion:2022\n"
                      "Host direct\n  HostName 10.0.0.5\n")
    return {"GPUHPC_CONFIG": str(user), "GPUHPC_SITE_CONFIG": str(tmp_path / "site.toml"),
            "GPUHPC_SSH_CONFIG": str(sshcfg)}, user


def test_profiles_are_read_and_checked(env):
    e, user = env
    user.write_text('[clusters.big]\nhost = "big"\nkey = "~/k"\n[cluster.small]\nhost = "x@small:2222"\n'
                    '[cmdserver]\nenabled = false\n')
    assert sorted(config.cluster_profiles(e)) == ["big", "small"]
    assert config.cluster_profile("big", e) == {"name": "big", "host": "big", "key": "~/k"}
    with pytest.raises(UserInputError, match="no cluster profile 'nope'") as err:
        config.cluster_profile("nope", e)
    assert "profiles: big, small" in err.value.one_line()


@pytest.mark.parametrize("text, match", [
    ('[clusters.a]\nuser = "x"\n', "has no host"),
    ('[clusters.a]\nhost = "h"\nport = "22"\n', "must be an integer"),
    ('[clusters.a]\nhost = "h"\nproxy = "j"\n', "unknown key clusters.a.proxy"),
    ('[clusters.a]\nhost = "h; id"\n', "blanks"),
    ('[clusters]\na = 1\n', "must be a table"),
])
def test_bad_profiles_are_one_line_errors(env, text, match):
    e, user = env
    user.write_text(text)
    with pytest.raises(UserInputError, match=match):
        config.cluster_profiles(e)


def test_ssh_config_fills_in_what_the_profile_leaves_out(env, monkeypatch):
    e, _ = env
    monkeypatch.setenv("GPUHPC_SSH_CONFIG", e["GPUHPC_SSH_CONFIG"])
    r = SSHRunner.from_profile({"name": "big", "host": "big"}, e)
    assert (r.host, r.user, r.port, r.jump) == ("login.big.example.org", "alice", 2200, "bob@bastion:2022")
    assert r.key_filename is None                   # the config's key file does not exist
    r = SSHRunner.from_profile({"name": "big", "host": "big", "user": "carol", "port": 22, "jump": "none"}, e)
    assert (r.user, r.port, r.jump) == ("carol", 22, None)       # the profile wins
    r = SSHRunner("direct")
    assert (r.host, r.port, r.jump) == ("10.0.0.5", 22, None)


def test_shared_runner_is_one_per_target(env, monkeypatch):
    e, user = env
    user.write_text('[clusters.big]\nhost = "big"\nslurm_conf = "/etc/slurm/x.conf"\n')
    a = shared_runner({**e, "GPUHPC_CLUSTER": "big"})
    assert a is shared_runner({**e, "GPUHPC_CLUSTER": "big"})
    assert a.name == "big" and a.getenv("SLURM_CONF") == "/etc/slurm/x.conf"
    b = shared_runner({**e, "GPUHPC_SSH_HOST": "root@127.0.0.1:2222"})
    assert b is not a and (b.user, b.host, b.port) == ("root", "127.0.0.1", 2222)
    with pytest.raises(UserInputError) as err:
        shared_runner({**e, "GPUHPC_CLUSTER": "bgi"})
    assert "profiles: big" in err.value.one_line()


def test_trust_names_a_profile_or_a_target(env):
    e, user = env
    user.write_text('[clusters.big]\nhost = "big"\n')
    assert runner_for("big", e).name == "big"
    assert runner_for("root@127.0.0.1:2222", e).port == 2222
    with pytest.raises(UserInputError) as err:
        runner_for("bgi", e)
    assert "profiles: big" in err.value.one_line()


def test_fingerprint_and_known_hosts_entry():
    assert host_entry("h", 22) == "h" and host_entry("h", 2222) == "[h]:2222"

    class K:
        def asbytes(self):
            return b"abc"
    assert fingerprint(K()) == "SHA256:ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0"
