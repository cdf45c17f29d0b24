"""The gpuhpc_containers role's configuration only (``--tags validate,configure``) into a temporary
root (connection=local; nothing is built, nothing of this machine's Slurm or /etc is touched), in
seconds: what it writes about trust (issue 39, points 3-5).

- enroot's per-user parents are root's 0755 (no user can make another's ``user-UID`` first; one
  made before, on a node that had world-writable parents, is named for root to remove), its
  temporary directory 1777 (enroot makes only ``mktemp -d`` directories there), the prolog drop-in
  and the enroot hook that refuse a directory not the user's own are installed;
- the site's registry credentials are root's only (0700 directory, 0600 file), root's
  ``ENROOT_CONFIG_PATH``; every other user's stays ``${HOME}/.config/enroot``;
- the site policy names the registries the role was given and pins every partition by default;
  with no registry named the role stops and asks; ``any`` is written only when chosen.
NVIDIA's container tools (issue 39.1: nvidia-container-cli, which enroot's 98-nvidia.sh calls for every
image that sets NVIDIA_VISIBLE_DEVICES): with the site's mirror the role writes NVIDIA's apt source and
key from it (``--tags validate,nvidia_repo``; the apt install itself needs a real mirror, none here),
and verify (``--tags nvidia_verify``) refuses a GPU host without nvidia-container-cli, naming the
setting; with the stand-in on the prefix's PATH it passes.
The whole role (build, verify) is tests/integration/containers/test_containers_role.py (stage c)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.isolated]

PLAY = """\
- name: gpuhpc_containers' configuration into a temporary root
  hosts: localhost
  gather_facts: false
  roles:
    - role: gpuhpc.cluster.gpuhpc_containers
"""


def _converge(tmp: Path, name: str, more: str, before=None,
              tags: str = "validate,configure") -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp / name
    (root / "etc/enroot/hooks.d").mkdir(parents=True)      # what the build installs (not run here)
    (root / "usr/local/share/enroot/hooks.d").mkdir(parents=True)
    for hook in ("50-slurm-pmi.sh", "50-slurm-pytorch.sh", "50-sharp.sh"):
        (root / "usr/local/share/enroot/hooks.d" / hook).write_text("#!/bin/sh\n")
    if before:
        before(root)
    play, extra = tmp / f"{name}-play.yml", tmp / f"{name}-extra.yml"
    play.write_text(PLAY)
    extra.write_text(f"""gpuhpc_containers_prefix: {root}/usr/local
gpuhpc_containers_sysconfdir: {root}/etc
gpuhpc_containers_scratch: {root}/scratch
gpuhpc_containers_plugstack_conf: {root}/etc/slurm/plugstack.conf
gpuhpc_containers_plugstack_dir: {root}/etc/slurm/plugstack.conf.d
gpuhpc_containers_policy_file: {root}/etc/gpuhpc/containers.toml
gpuhpc_containers_prolog_dir: {root}/etc/gpuhpc/prolog.d
gpuhpc_containers_pyxis_args: [runtime_path={root}/run/pyxis]
gpuhpc_containers_apt_sources_dir: {root}/etc/apt/sources.list.d
gpuhpc_containers_apt_keyrings_dir: {root}/etc/apt/keyrings
{more}""")
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
                "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),
                "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible-tmp"), "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1",
                "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"})
    proc = subprocess.run([str(venv_bin / "ansible-playbook"), "-i", "localhost,", str(play), "--tags", tags,
                           "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}",
                           "-e", f"@{extra}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return root, proc


def _mode(p: Path) -> tuple[int, int]:
    st = os.lstat(p)
    return st.st_uid, st.st_mode & 0o7777


def _old_node(root: Path) -> None:
    """A node converged before the parents were root's: world-writable, a user's own directory
    and one another user made for uid 4242 (what root must remove)."""
    for d in ("run", "cache", "data"):
        (root / "scratch/enroot" / d).mkdir(parents=True)
        (root / "scratch/enroot" / d).chmod(0o1777)
    (root / "scratch/enroot/cache/user-0").mkdir(mode=0o700)
    (root / "scratch/enroot/cache/user-4242").mkdir()
    (root / "scratch/enroot/cache/user-4242").chmod(0o777)


def test_the_role_writes_root_only_credentials_root_owned_parents_and_the_site_policy(tmp_path):
    root, proc = _converge(tmp_path, "site", before=_old_node, more="""gpuhpc_containers_verify_image: "registry.example.org:5000#base/debian@sha256:{0}"
gpuhpc_containers_registry_credentials:
  - {{machine: nvcr.io, login: "$oauthtoken", password: "ngc-key-3f9a"}}
""".format("ab" * 32))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "ngc-key-3f9a" not in proc.stdout                                          # no_log
    for d in ("run", "cache", "data"):                                                 # point 3
        assert _mode(root / "scratch/enroot" / d) == (0, 0o755), d
    named = re.findall(r"enroot directory not its user's own \(owner uid, mode, type, path\): (.*?)\"", proc.stdout)
    assert named == [f"0 777 d {root}/scratch/enroot/cache/user-4242"], proc.stdout[-3000:]   # for root to remove
    assert _mode(root / "scratch/enroot/tmp") == (0, 0o1777)
    dropin = root / "etc/gpuhpc/prolog.d/50-gpuhpc-enroot-dirs"
    assert _mode(dropin) == (0, 0o755) and f"{root}/scratch/enroot/cache" in dropin.read_text()
    assert os.access(root / "etc/enroot/hooks.d/00-gpuhpc-own-dirs.sh", os.X_OK)
    assert os.access(root / "etc/enroot/hooks.d/51-gpuhpc-pmix-nodename.sh", os.X_OK)    # after 50-slurm-pmi
    for hook in ("50-slurm-pmi.sh", "50-slurm-pytorch.sh"):                            # point 6: enroot's own, enabled
        assert os.readlink(root / "etc/enroot/hooks.d" / hook) == f"{root}/usr/local/share/enroot/hooks.d/{hook}"
    assert not (root / "etc/enroot/hooks.d/50-sharp.sh").exists()                     # the others stay off
    site = root / "etc/enroot/site"                                                    # point 4
    assert _mode(site) == (0, 0o700) and _mode(site / ".credentials") == (0, 0o600)
    assert "machine nvcr.io login $oauthtoken password ngc-key-3f9a\n" in (site / ".credentials").read_text()
    conf = (root / "etc/enroot/enroot.conf").read_text()
    line = next(x for x in conf.splitlines() if x.startswith("ENROOT_CONFIG_PATH "))
    assert line == (f'ENROOT_CONFIG_PATH $([ "$(id -u)" = 0 ] && echo {site} || echo "${{HOME}}/.config/enroot")')
    policy = root / "etc/gpuhpc/containers.toml"                                       # point 5
    assert _mode(policy) == (0, 0o644)
    assert tomllib.loads(policy.read_text())["containers"] == {
        "allowed_registries": ["nvcr.io", "registry.example.org:5000"], "require_digest_partitions": ["*"]}


def test_without_credentials_every_user_keeps_their_own_enroot_config(tmp_path):
    root, proc = _converge(tmp_path, "plain", 'gpuhpc_containers_allowed_registries: [nvcr.io]\n'
                                              'gpuhpc_containers_require_digest_partitions: [gpu-hi]\n')
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "ENROOT_CONFIG_PATH ${HOME}/.config/enroot\n" in (root / "etc/enroot/enroot.conf").read_text()
    assert not (root / "etc/enroot/site").exists()
    assert tomllib.loads((root / "etc/gpuhpc/containers.toml").read_text())["containers"] == {
        "allowed_registries": ["nvcr.io"], "require_digest_partitions": ["gpu-hi"]}


def test_no_registry_named_stops_the_role_and_any_is_an_explicit_choice(tmp_path):
    _, refused = _converge(tmp_path, "none", "")
    assert refused.returncode != 0
    assert re.search(r"gpuhpc_containers_allowed_registries must list the registries", refused.stdout), refused.stdout[-3000:]
    root, chosen = _converge(tmp_path, "any", "gpuhpc_containers_allowed_registries: any\n"
                                              "gpuhpc_containers_require_digest_partitions: []\n")
    assert chosen.returncode == 0, chosen.stdout[-4000:] + chosen.stderr[-2000:]
    text = (root / "etc/gpuhpc/containers.toml").read_text()
    assert "gpuhpc_containers_allowed_registries: any" in text
    assert tomllib.loads(text)["containers"] == {"allowed_registries": [], "require_digest_partitions": []}


KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----\n(the mirror's copy of NVIDIA's key)\n-----END PGP PUBLIC KEY BLOCK-----\n"


def test_with_the_site_mirror_the_role_writes_nvidias_apt_source_and_key_from_it(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "gpgkey").write_text(KEY)
    root, proc = _converge(tmp_path, "nv", f"gpuhpc_containers_allowed_registries: [nvcr.io]\n"
                                          f"gpuhpc_containers_nvidia_repo: file://{mirror}/\n", tags="validate,nvidia_repo",
                           before=lambda r: (r / "etc/apt/sources.list.d").mkdir(parents=True))   # apt's own
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    key = root / "etc/apt/keyrings/nvidia-container-toolkit.asc"
    assert key.read_text() == KEY and _mode(key)[1] == 0o644
    source = (root / "etc/apt/sources.list.d/nvidia-container-toolkit.list").read_text().splitlines()
    assert source[1:] == [f"deb [signed-by={key}] file://{mirror}/stable/deb/$(ARCH) /"], source
    _, bad = _converge(tmp_path, "nvbad", "gpuhpc_containers_allowed_registries: [nvcr.io]\n"
                                          "gpuhpc_containers_nvidia_repo: 'https://mirror.example.org/x y'\n",
                       tags="validate,nvidia_repo")
    assert bad.returncode != 0 and "gpuhpc_containers_nvidia_repo must be the URL of the site's mirror" in bad.stdout, \
        bad.stdout[-3000:]
    assert not (tmp_path / "nvbad/etc/apt/sources.list.d").exists()


def test_verify_refuses_a_gpu_host_without_nvidia_container_cli_and_passes_with_it(tmp_path):
    more = "gpuhpc_containers_allowed_registries: [nvcr.io]\ngpuhpc_containers_nvidia: true\n"
    _, missing = _converge(tmp_path, "gpu", more, tags="nvidia_verify")
    assert missing.returncode != 0, missing.stdout[-3000:]
    assert ("nvidia-container-cli (libnvidia-container-tools) is missing on localhost: enroot's 98-nvidia.sh fails "
            "every image that sets NVIDIA_VISIBLE_DEVICES (NGC images). Set gpuhpc_containers_nvidia_repo") \
        in missing.stdout, missing.stdout[-3000:]

    def standin(root: Path) -> None:        # nvidia-container-cli on the prefix's PATH (tests/standins)
        (root / "usr/local/bin").mkdir(parents=True)
        (root / "usr/local/bin/nvidia-container-cli").symlink_to(REPO / "tests/standins/nvidia-container-cli")
    _, found = _converge(tmp_path, "gpu2", more, before=standin, tags="nvidia_verify")
    assert found.returncode == 0, found.stdout[-3000:]
    _, cpu = _converge(tmp_path, "cpu", "gpuhpc_containers_allowed_registries: [nvcr.io]\n", tags="nvidia_verify")
    assert cpu.returncode == 0, cpu.stdout[-3000:]          # auto: no NVIDIA driver on this host, no GPUs to give
