"""The site's trust policy ([containers] in the site config): exit 2 at submit, nothing queued."""
from __future__ import annotations

import pytest

from gpuhpc.cli import submit as cli_submit
from gpuhpc.containers.image import Policy, check_image, parse_ref, site_policies
from gpuhpc.errors import UserInputError

DIGEST = "sha256:" + "12" * 32


@pytest.fixture
def site(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text('[containers]\nallowed_registries = ["nvcr.io", "127.0.0.1:5000"]\n'
                    'require_digest_partitions = ["gpu-hi"]\n')
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(path))
    return path


def test_policy_rules():
    p = Policy(("nvcr.io",), ("gpu",))
    p.check(parse_ref("nvcr.io#nvidia/pytorch:24.05-py3"), "cpu")
    p.check(parse_ref(f"nvcr.io#nvidia/pytorch@{DIGEST}"), "gpu")
    with pytest.raises(UserInputError, match="registry docker.io is not allowed"):
        p.check(parse_ref("ubuntu:22.04"), "cpu")
    with pytest.raises(UserInputError, match="partition gpu runs only images pinned by digest") as e:
        p.check(parse_ref("nvcr.io#nvidia/pytorch:24.05-py3"), "gpu")
    assert "gpuhpc image pin nvcr.io#nvidia/pytorch:24.05-py3" in e.value.hint
    with pytest.raises(UserInputError, match=r"partition \(default\) runs only"):
        Policy((), ("*",)).check(parse_ref("a#b:1"), None)
    with pytest.raises(UserInputError, match="the default partition may run only images pinned"):
        Policy((), ("gpu",)).check(parse_ref("nvcr.io#a/b:1"), None)
    Policy((), ("gpu",)).check(parse_ref(f"nvcr.io#a/b@{DIGEST}"), None)
    Policy().check(parse_ref("anything.example#x:1"), None)          # no rules: anything


def test_site_config(site):
    [policy] = site_policies()
    assert policy.allowed_registries == ("nvcr.io", "127.0.0.1:5000") and policy.source == str(site)
    check_image(f"127.0.0.1:5000#gpuhpc/test@{DIGEST}", "gpu-hi")
    with pytest.raises(UserInputError, match=f"not allowed on this cluster \\(site config {site}\\)"):
        check_image("quay.io#x/y:1", "gpu")


@pytest.mark.parametrize("text, words", [
    ('[containers]\nallowed_registries = "nvcr.io"\n', "must be a list"),
    ('[containers]\nallowed_registries = [1]\n', "list of non-empty strings"),
    ('[containers]\nallowed_registries = ["bad host"]\n', "not a registry"),
    ('[containers]\npinned = true\n', "unknown key containers.pinned"),
])
def test_bad_site_config(tmp_path, monkeypatch, text, words):
    path = tmp_path / "config.toml"
    path.write_text(text)
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(path))
    with pytest.raises(UserInputError, match=words):
        check_image("nvcr.io#a/b:1", None)


@pytest.mark.parametrize("argv, words", [
    (["--image", "quay.io#x/y:1"], "registry quay.io is not allowed"),
    (["--image", "127.0.0.1:5000#gpuhpc/test:1", "-p", "gpu-hi"], "partition gpu-hi runs only images pinned"),
])
def test_cli_refuses_before_anything_runs(site, monkeypatch, argv, words):
    def no_slurm(*a, **k):
        raise AssertionError("a refused image must not reach Slurm")

    monkeypatch.setattr("gpuhpc.jobs.script_mode.slurm_client", no_slurm)
    with pytest.raises(UserInputError, match=words) as e:
        cli_submit.run([*argv, "--", "cat", "/etc/os-release"])
    assert e.value.exit_code == 2 and str(e.value).startswith("image: ")


def test_the_containers_roles_policy_file_binds_beside_the_site_config(tmp_path, monkeypatch):
    """gpuhpc_containers writes its policy to POLICY_FILE (not config.toml, the login role's): it binds
    every user; a non-root user's GPUHPC_SITE_CONFIG cannot lift it, root's replaces it (tests)."""
    from gpuhpc import config
    from gpuhpc.containers import image

    role = tmp_path / "containers.toml"
    role.write_text('[containers]\nallowed_registries = ["nvcr.io"]\nrequire_digest_partitions = ["*"]\n')
    monkeypatch.setattr(image, "POLICY_FILE", str(role))
    monkeypatch.setattr(config, "SITE_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.delenv("GPUHPC_SITE_CONFIG", raising=False)
    with pytest.raises(UserInputError, match=f"registry quay.io is not allowed on this cluster \\(site config {role}\\)"):
        check_image(f"quay.io#x/y@{DIGEST}", "cpu")
    with pytest.raises(UserInputError, match="runs only images pinned by digest"):
        check_image("nvcr.io#x/y:1", "cpu")
    own = tmp_path / "own.toml"
    own.write_text("[containers]\nallowed_registries = []\n")
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(own))
    monkeypatch.setattr(image.os, "geteuid", lambda: 1000)
    with pytest.raises(UserInputError, match="registry quay.io is not allowed"):
        check_image(f"quay.io#x/y@{DIGEST}", "cpu")
    monkeypatch.setattr(image.os, "geteuid", lambda: 0)
    check_image("quay.io#x/y:1", "cpu")                              # root's override: the test's rules only
