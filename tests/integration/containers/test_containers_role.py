"""The gpuhpc_containers role into a temporary root (connection=local; nothing of this machine's
Slurm or /etc is touched): enroot and pyxis built from the source archives of
$GPUHPC_VENDOR_DIR into ROOT/usr/local, enroot.conf with per-user paths on ROOT/scratch, the GPU
hook, root-only registry credentials (from a vault-encrypted file), plugstack.conf.d, the site's
image policy and the prolog drop-in (both under ROOT too); verify imports and
starts the local registry's test image. The second run and a --check run change nothing.
Needs the source-archive mirror (scripts/test.sh VENDOR); isolated."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pyxis_cluster import registry_image

REPO = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.isolated]

PLAY = """\
- name: gpuhpc_containers into a temporary root
  hosts: localhost
  gather_facts: false
  roles:
    - role: gpuhpc.cluster.gpuhpc_containers
"""


def _env(tmp: Path) -> dict[str, str]:
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env.update({"ANSIBLE_CONFIG": str(REPO / "ansible" / "ansible.cfg"),
                "ANSIBLE_COLLECTIONS_PATH": str(REPO / "ansible"),       # ansible_collections/gpuhpc/cluster -> ../..
                "ANSIBLE_LOCAL_TEMP": str(tmp / ".ansible-tmp"), "ANSIBLE_NOCOLOR": "1", "NO_COLOR": "1",
                "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}"})
    return env


def _recap(proc: subprocess.CompletedProcess) -> dict[str, int]:
    text = proc.stdout[proc.stdout.rindex("PLAY RECAP"):]
    return {k: sum(int(n) for n in re.findall(rf"{k}=(\d+)", text)) for k in ("changed", "failed")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    assert os.environ.get("GPUHPC_VENDOR_DIR"), "set GPUHPC_VENDOR_DIR to the source mirror (docs/containers.md)"
    tmp = tmp_path_factory.mktemp("containers-role")
    root = tmp / "root"
    image = registry_image()
    vars_file, password = tmp / "vault.yml", tmp / "vault-pass"
    vars_file.write_text('vault_ngc_api_key: "ngc-key-3f9a"\n')
    password.write_text("containers-role-test\n")
    subprocess.run([str(Path(sys.executable).with_name("ansible-vault")), "encrypt", "--vault-password-file",
                    str(password), str(vars_file)], check=True, capture_output=True, timeout=60)
    play = tmp / "play.yml"
    play.write_text(PLAY)
    extra = tmp / "extra.yml"
    extra.write_text(f"""gpuhpc_containers_mirror_dir: {os.environ['GPUHPC_VENDOR_DIR']}
gpuhpc_containers_prefix: {root}/usr/local
gpuhpc_containers_sysconfdir: {root}/etc
gpuhpc_containers_work_dir: {root}/var/cache/gpuhpc-containers
gpuhpc_containers_scratch: {root}/scratch
gpuhpc_containers_plugstack_conf: {root}/etc/slurm/plugstack.conf
gpuhpc_containers_plugstack_dir: {root}/etc/slurm/plugstack.conf.d
gpuhpc_containers_policy_file: {root}/etc/gpuhpc/containers.toml
gpuhpc_containers_prolog_dir: {root}/etc/gpuhpc/prolog.d
gpuhpc_containers_allow_http: true
gpuhpc_containers_verify_image: "{image}"
gpuhpc_containers_importer_python: {sys.executable}
gpuhpc_containers_registry_credentials:
  - {{machine: nvcr.io, login: "$oauthtoken", password: "{{{{ vault_ngc_api_key }}}}"}}
""")
    argv = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", str(play),
            "-e", "ansible_connection=local", "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", f"@{extra}", "-e", f"@{vars_file}", "--vault-password-file", str(password)]

    def run(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run([*argv, *more], cwd=REPO, env=_env(tmp), capture_output=True, text=True, timeout=600)
    return {"root": root, "first": run(), "again": run(), "check": run("--check", "--diff")}


def test_the_role_installs_and_configures_enroot_and_pyxis_and_runs_a_container(runs):
    root, first = runs["root"], runs["first"]
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    assert _recap(first)["changed"] > 0
    assert 'PRETTY_NAME=\\"gpuhpc test image 1 (busybox)\\"' in first.stdout, first.stdout[-3000:]   # verify ran it
    assert subprocess.run([str(root / "usr/local/bin/enroot"), "version"], capture_output=True,
                          text=True).stdout.strip() == "4.1.2"
    conf = (root / "etc/enroot/enroot.conf").read_text()
    assert f"ENROOT_DATA_PATH {root}/scratch/enroot/data/user-$(id -u)\n" in conf
    assert "ENROOT_SQUASH_OPTIONS -noI -noD -noF -noX -no-duplicates\n" in conf and "ENROOT_ALLOW_HTTP yes\n" in conf
    assert f'ENROOT_CONFIG_PATH $([ "$(id -u)" = 0 ] && echo {root}/etc/enroot/site || echo "${{HOME}}/.config/enroot")\n' \
        in conf                                                    # root's: the site's (verify used it); users': their own
    creds = root / "etc/enroot/site/.credentials"
    assert "machine nvcr.io login $oauthtoken password ngc-key-3f9a\n" in creds.read_text()
    assert creds.stat().st_mode & 0o777 == 0o600 and creds.parent.stat().st_mode & 0o777 == 0o700
    assert "ngc-key-3f9a" not in first.stdout                      # no_log
    for d in ("enroot/data", "enroot/run", "enroot/cache"):
        assert (root / "scratch" / d).stat().st_mode & 0o7777 == 0o755, d
    for d in ("enroot/tmp", "gpuhpc-images"):
        assert (root / "scratch" / d).stat().st_mode & 0o7777 == 0o1777, d
    assert os.access(root / "etc/enroot/hooks.d/90-gpuhpc-slurm-gpus.sh", os.X_OK)
    importer = root / "usr/local/libexec/gpuhpc-pyxis-importer"
    assert (root / "etc/slurm/plugstack.conf.d/pyxis.conf").read_text().splitlines()[-1] == \
        f"required {root}/usr/local/lib/slurm/spank_pyxis.so runtime_path=/run/pyxis importer={importer}"
    usage = subprocess.run([str(importer)], capture_output=True, text=True)     # gpuhpc.containers.importer
    assert usage.returncode == 2 and "importer get docker://REF" in usage.stderr
    assert (root / "etc/slurm/plugstack.conf").read_text() == f"include {root}/etc/slurm/plugstack.conf.d/*.conf\n"


def test_a_second_run_and_check_mode_change_nothing(runs):
    for name in ("again", "check"):
        proc = runs[name]
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        assert _recap(proc) == {"changed": 0, "failed": 0}, f"{name}:\n{proc.stdout[-4000:]}"
