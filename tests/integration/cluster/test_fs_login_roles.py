"""The filesystem and login roles of the installed gpuhpc.cluster collection, run on this machine
against a temporary root (connection=local; this machine's /etc/fstab, mounts, sshd and PAM are never
touched) with examples/clusters/dgx-h100-pod.yaml as the spec.

- gpuhpc_lustre_client writes lnet.conf and the fstab line from the spec; LNet, mounts and `lfs df`
  skip with one line each (no lnet module, no mount.lustre here: Lustre is not packaged in Debian);
- gpuhpc_beegfs_client writes one beegfs-client.conf, connInterfaces and connauth file per mount, the
  secrets coming from an ansible-vault encrypted vars file (never printed); mounts and `beegfs-df` skip;
- hardening's nftables networks and nvme_scratch's drives come from the spec;
- gpuhpc_login installs into a temporary prefix, writes a config.toml that gpuhpc.config reads and the
  ledger ingest timer's units (the timer is not started: systemd is not PID 1 here, said in one line);
- a second run changes nothing (changed=0); on a fresh host --check says the venv would be built
  and writes nothing.

The filesystem clients and the login role converge once per module, in one play into one temporary
root (then the second run); the check-mode tests share one --check --diff play.
"""
from __future__ import annotations

import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuhpc import config

from .conftest import REPO, recap, run_playbook

pytestmark = [pytest.mark.integration, pytest.mark.isolated]

DGX = REPO / "examples" / "clusters" / "dgx-h100-pod.yaml"
# Debian 12's /etc/pam.d/common-session as pam-auth-update writes it with libpam-systemd installed
COMMON_SESSION = """\
session	[default=1]			pam_permit.so
session	requisite			pam_deny.so
session	required			pam_permit.so
session	required	pam_unix.so 
session	optional	pam_systemd.so 
# end of pam-auth-update config
"""
SECRETS = {"vault_beegfs_home_connauth": "home-connauth-8f2c1d", "vault_beegfs_scratch_connauth": "scratch-connauth-77ab90"}

PLAY = """\
- name: {title}
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Load the cluster spec (gpuhpc_slurm_common_conf)
      ansible.builtin.include_role:
        name: gpuhpc.cluster.gpuhpc_slurm_common
        tasks_from: context.yml
{roles}
"""
ROLE = """\
    - name: {name}
      ansible.builtin.include_role:
        name: gpuhpc.cluster.{name}
{extra}"""


def _playbook(tmp: Path, name: str, *roles: tuple[str, str]) -> Path:
    body = "".join(ROLE.format(name=r, extra=extra) for r, extra in roles)
    path = tmp / name
    path.write_text(PLAY.format(title="Roles from the spec, in a temporary root", roles=body))
    return path


def _run(playbook: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = run_playbook(str(playbook), "localhost,", "-e", "ansible_connection=local",
                        "-e", f"ansible_python_interpreter={sys.executable}",
                        "-e", f"gpuhpc_slurm_common_spec={DGX}", "-e", "gpuhpc_slurm_common_billing_file=''",
                        *extra, tmp=tmp, timeout=300)
    return proc


def _vault(tmp: Path) -> list[str]:
    """An ansible-vault encrypted vars file with the BeeGFS secrets, and its password file."""
    vars_file, password = tmp / "vault.yml", tmp / "vault-pass"
    vars_file.write_text("".join(f'{k}: "{v}"\n' for k, v in SECRETS.items()))
    password.write_text("fs-login-test-vault\n")
    exe = Path(sys.executable).with_name("ansible-vault")
    subprocess.run([str(exe), "encrypt", "--vault-password-file", str(password), str(vars_file)],
                   check=True, capture_output=True, timeout=60)
    assert "$ANSIBLE_VAULT" in vars_file.read_text()
    return ["-e", f"@{vars_file}", "--vault-password-file", str(password)]


@pytest.fixture(scope="module")
def converged(collection, tmp_path_factory) -> dict:
    """gpuhpc_lustre_client, gpuhpc_beegfs_client and gpuhpc_login in one play, into one temporary
    root, run twice: the first run and the second (which must change nothing), for the module."""
    tmp = tmp_path_factory.mktemp("fs-login")
    root, prefix, login = _login_root(tmp)
    # gpuhpc of this version is already installed in the running venv: the role finds its pinned
    # requirement satisfied there (offline: an empty wheelhouse, no index) and keeps it
    (prefix / "venv").symlink_to(sys.prefix)
    # no Lustre or BeeGFS client here: write the configuration, skip the mounts (saying why)
    paths = ["-e", f"gpuhpc_lustre_client_lnet_conf={root}/etc/lnet.conf",
             "-e", f"gpuhpc_lustre_client_fstab={root}/etc/fstab",
             "-e", f"gpuhpc_beegfs_client_conf_dir={root}/etc/beegfs",
             "-e", f"gpuhpc_beegfs_client_apt_pin_file={root}/etc/apt/preferences.d/gpuhpc-beegfs",
             "-e", "gpuhpc_lustre_client_require_client=false", "-e", "gpuhpc_beegfs_client_require_client=false"]
    # a compute host's PAM and logind files (Debian 12's common-session, sshd's account stack)
    pam = root / "etc" / "pam.d"
    pam.mkdir(parents=True)
    (root / "etc" / "apt" / "preferences.d").mkdir(parents=True)
    (pam / "common-session").write_text(COMMON_SESSION)
    (pam / "sshd").write_text("@include common-auth\naccount    required     pam_nologin.so\n@include common-account\n")
    adopt = ["-e", f"gpuhpc_hardening_pam_common_session={pam}/common-session", "-e", f"gpuhpc_hardening_pam_sshd={pam}/sshd",
             "-e", f"gpuhpc_hardening_ssh_exempt_file={root}/etc/gpuhpc/ssh-exempt-users",
             "-e", f"gpuhpc_hardening_logind_dropin={root}/etc/systemd/logind.conf.d/50-gpuhpc.conf"]
    play = _playbook(tmp, "fs-login.yml", ("gpuhpc_lustre_client", ""), ("gpuhpc_beegfs_client", ""),
                     ("gpuhpc_login", ""), ("gpuhpc_hardening", "        tasks_from: adopt.yml\n"))
    vault = _vault(tmp)
    first = _run(play, tmp, *paths, *login, *vault, *adopt)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    again = _run(play, tmp, *paths, *login, *vault, *adopt)
    return {"tmp": tmp, "root": root, "prefix": prefix, "first": first, "again": again}


def test_filesystem_clients_render_from_the_spec_and_skip_the_hardware(converged):
    root, first = converged["root"], converged["first"]
    out = first.stdout

    assert (root / "etc" / "lnet.conf").read_text().split("\n", 2)[2] == (
        "net:\n"
        "    - net type: o2ib0\n      local NI(s):\n"
        "        - interfaces:\n              0: ib0\n        - interfaces:\n              0: ib1\n"
        "    - net type: tcp0\n      local NI(s):\n        - interfaces:\n              0: bond0\n")
    assert (root / "etc" / "fstab").read_text() == \
        "10.20.0.1@o2ib:10.20.0.2@o2ib:/lfs1 /lustre/lfs1 lustre flock,noatime,_netdev,x-systemd.requires=lnet.service 0 0\n"
    assert ("lustre_client: LNet and mounts skipped: no lnet kernel module (modinfo lnet), no /sbin/mount.lustre "
            "on this host (Lustre is not packaged in Debian: set gpuhpc_lustre_client_apt_repo)") in out
    assert "lustre_client verify skipped: no lnet kernel module (modinfo lnet), no /sbin/mount.lustre on this host" in out

    # one instance directory per mount (beegfs-client@NAME, beegfs-helperd@NAME), the packages pinned to 7.4
    beegfs = root / "etc" / "beegfs"
    assert "Pin: version 7.4.*" in (root / "etc" / "apt" / "preferences.d" / "gpuhpc-beegfs").read_text()
    assert not (beegfs / "beegfs-mounts.conf").exists()
    for mount in ("home", "scratch"):
        assert (beegfs / f"{mount}.d" / "beegfs-mounts.conf").read_text().splitlines()[2:] == [
            f"/beegfs/{mount} {beegfs}/{mount}.d/beegfs-client.conf"]
    home = dict(re.findall(r"^(\w+)\s*=[ \t]*(.*)$", (beegfs / "home.d" / "beegfs-client.conf").read_text(), re.M))
    scratch = dict(re.findall(r"^(\w+)\s*=[ \t]*(.*)$", (beegfs / "scratch.d" / "beegfs-client.conf").read_text(), re.M))
    assert (home["sysMgmtdHost"], home["connUseRDMA"], home["connDisableAuthentication"]) == ("beegfs-mgmt1", "false", "false")
    assert "connClientPortUDP" not in home                     # BeeGFS's default port, 8004
    assert (scratch["sysMgmtdHost"], scratch["connUseRDMA"], scratch["connClientPortUDP"], scratch["connHelperdPortTCP"]) \
        == ("beegfs-mgmt2", "true", "8014", "8016")
    # the second mount's helperd listens where its client looks (8016), the first on BeeGFS's 8006
    assert "connHelperdPortTCP           = 8016" in (beegfs / "scratch.d" / "beegfs-helperd.conf").read_text()
    assert "connHelperdPortTCP           = 8006" in (beegfs / "home.d" / "beegfs-helperd.conf").read_text()
    assert (beegfs / "scratch.d" / "connInterfaces").read_text() == "ib0\nib1\n"
    assert home["connInterfacesFile"] == f"{beegfs}/home.d/connInterfaces"
    for mount, secret in (("home", SECRETS["vault_beegfs_home_connauth"]), ("scratch", SECRETS["vault_beegfs_scratch_connauth"])):
        auth = beegfs / f"{mount}.d" / "connauth"
        assert auth.read_text() == secret
        assert stat.S_IMODE(auth.stat().st_mode) == 0o400
        assert f"connAuthFile                 = {auth}" in (beegfs / f"{mount}.d" / "beegfs-client.conf").read_text()
        assert f"connAuthFile                 = {auth}" in (beegfs / f"{mount}.d" / "beegfs-helperd.conf").read_text()
        for run in (first, converged["again"]):
            assert secret not in run.stdout and secret not in run.stderr
    assert "beegfs_client: mounts skipped: no beegfs kernel module (modinfo beegfs), no /usr/bin/beegfs-df on this host" in out
    assert "beegfs_client verify skipped: no beegfs kernel module (modinfo beegfs), no /usr/bin/beegfs-df on this host" in out

    # what is written now matches: the second run changes nothing
    again = converged["again"]
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]


def test_compute_host_sessions_stay_in_the_job(converged):
    """gpuhpc_hardening on a compute host (its adopt tasks, into the temporary root): pam_slurm_adopt in
    sshd's account stack, pam_systemd out of the session stack (an adopted session stays in the job's
    cgroup), logind RemoveIPC=no (a closing session keeps the jobs' shared memory); a re-run changes nothing."""
    root, first = converged["root"], converged["first"]
    pam = root / "etc" / "pam.d"
    session = (pam / "common-session").read_text()
    assert "# gpuhpc_hardening (pam_slurm_adopt): session\toptional\tpam_systemd.so" in session
    assert not re.search(r"^session\s+\S+\s+pam_systemd", session, re.M)
    assert "session\trequired\tpam_unix.so" in session
    sshd = (pam / "sshd").read_text()
    assert sshd.index("@include common-account") < sshd.index("account required pam_slurm_adopt.so action_no_jobs=deny")
    assert f"file={root}/etc/gpuhpc/ssh-exempt-users" in sshd
    assert "[Login]\nRemoveIPC=no\n" in (root / "etc" / "systemd" / "logind.conf.d" / "50-gpuhpc.conf").read_text()
    assert first.returncode == 0 and recap(converged["again"])["changed"] == 0


RESCUED = """\
    - name: {name}
      block:
        - name: {name}
          ansible.builtin.include_role:
            name: gpuhpc.cluster.{name}
          vars: {vars}
      rescue:
        - name: Show why {name} failed
          ansible.builtin.debug:
            msg: "RESCUED {{{{ ansible_failed_result.msg }}}}"
"""


def test_a_missing_client_fails_the_play_saying_why_and_beegfs_8_has_no_helperd(collection, tmp_path):
    """By default a host without the Lustre or BeeGFS client fails (one line each: the roles run in
    rescue blocks of one play here); BeeGFS 8 writes no helperd configuration and pins 8.*. A third
    block, with the home mount's vault secret only: a missing secret is one line naming the mount,
    before anything is written."""
    root = tmp_path / "root"
    root.mkdir()
    play = tmp_path / "missing.yml"
    blocks = (("gpuhpc_lustre_client", {}),
              ("gpuhpc_beegfs_client", {"gpuhpc_beegfs_client_conf_dir": f"{root}/etc/beegfs", **SECRETS}),
              ("gpuhpc_beegfs_client", {"gpuhpc_beegfs_client_conf_dir": f"{tmp_path}/beegfs",
                                        "vault_beegfs_home_connauth": SECRETS["vault_beegfs_home_connauth"]}))
    play.write_text(PLAY.format(title="Filesystem clients missing on this host",
                                roles="".join(RESCUED.format(name=n, vars=json.dumps(v)) for n, v in blocks)))
    proc = _run(play, tmp_path, "-e", f"gpuhpc_lustre_client_lnet_conf={root}/etc/lnet.conf",
                "-e", f"gpuhpc_lustre_client_fstab={root}/etc/fstab",
                "-e", f"gpuhpc_beegfs_client_apt_pin_file={root}/pin", "-e", "gpuhpc_beegfs_client_major=8")
    assert proc.returncode == 0, proc.stdout[-3000:]
    rescued = [line.split("RESCUED ", 1)[1] for line in proc.stdout.splitlines() if "RESCUED " in line and "msg" in line]
    assert len(rescued) == 3, proc.stdout[-3000:]
    assert rescued[0].startswith("lustre_client: the cluster spec mounts /lustre/lfs1 but this host has no lnet kernel "
                                 "module (modinfo lnet), no /sbin/mount.lustre; set gpuhpc_lustre_client_apt_repo"), rescued[0]
    assert rescued[1].startswith("beegfs_client: the cluster spec mounts /beegfs/home, /beegfs/scratch but this host has "
                                 "no beegfs kernel module (modinfo beegfs) (BeeGFS 8);"), rescued[1]
    assert not (root / "etc" / "lnet.conf").exists()
    beegfs = root / "etc" / "beegfs"
    assert (beegfs / "scratch.d" / "beegfs-client.conf").is_file()
    assert not (beegfs / "scratch.d" / "beegfs-helperd.conf").exists()
    assert "Pin: version 8.*" in (root / "pin").read_text()

    # the missing vault secret
    assert rescued[2].startswith("BeeGFS mount(s) scratch: the connection-auth secret is missing or shorter than 8 "
                                 "characters; set the variable the spec's connauth_secret names in an ansible-vault file"), \
        rescued[2]
    assert not any(secret in proc.stdout for secret in SECRETS.values())
    assert not (tmp_path / "beegfs").exists()


@pytest.fixture(scope="module")
def check_mode(collection, tmp_path_factory) -> dict:
    """One --check --diff play: the validate phases of gpuhpc_nvme_scratch and gpuhpc_hardening for a
    DGX node, and gpuhpc_login on a fresh host (an empty temporary root)."""
    tmp = tmp_path_factory.mktemp("check")
    root, prefix, login = _login_root(tmp)
    prefix.rmdir()
    (tmp / "dgx-release").write_text('DGX_NAME="DGX Server"\nDGX_SWBUILD_VERSION="5.1.0"\nDGX_OTA_VERSION="5.2.0"\n')
    play = _playbook(tmp, "check.yml",
                     ("gpuhpc_nvme_scratch", "        tasks_from: validate.yml\n"),
                     ("gpuhpc_nvme_scratch", f"        tasks_from: validate.yml\n      vars:\n"
                                             f"        _gpuhpc_nvme_scratch_dgx_release: {tmp}/dgx-release\n"),
                     ("gpuhpc_hardening", "        tasks_from: validate.yml\n"),
                     ("gpuhpc_login", ""))
    proc = _run(play, tmp, *login, "--check", "--diff", "-e", '{"gpuhpc_slurm_compute_nodes": ["dgx001"]}')
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {"root": root, "prefix": prefix, "proc": proc, "tmp": tmp}


def test_hardening_and_nvme_scratch_take_the_spec(check_mode):
    """The spec's management network and a DGX node's scratch drives reach the roles (their validate
    phases in check mode: nothing is touched)."""
    proc = check_mode["proc"]
    drives = ", ".join(f"/dev/nvme{i}n1" for i in range(2, 10))
    assert f"NVMe assembly skipped: not all of {drives} are block devices on this host; /raid is a directory" in proc.stdout
    # recorded DGX OS facts (/etc/dgx-release): DGX OS's own /raid is left alone, said in one line
    assert (f"NVMe assembly skipped: DGX OS ({check_mode['tmp']}/dgx-release) assembles and mounts its own /raid: "
            "left as it is") in proc.stdout, proc.stdout[-3000:]
    assert "(item=10.10.0.0/16)" in proc.stdout
    assert "firewall skipped" not in proc.stdout


def _login_root(tmp: Path) -> tuple[Path, Path, list[str]]:
    """A temporary root for gpuhpc_login: (root, install prefix, the -e arguments that point there)."""
    root = tmp / "root"
    prefix = root / "opt" / "gpuhpc"
    prefix.mkdir(parents=True)
    for d in ("usr/local/sbin", "etc/systemd/system", "wheels"):
        (root / d).mkdir(parents=True)
    db = root / "var" / "lib" / "gpuhpc" / "ledger.db"
    args = ["-e", f"gpuhpc_login_prefix={prefix}", "-e", f"gpuhpc_login_bin_link={root}/usr/local/bin/gpuhpc",
            "-e", f"gpuhpc_login_site_config={root}/etc/gpuhpc/config.toml", "-e", "gpuhpc_login_install_packages=false",
            "-e", f"gpuhpc_login_wheelhouse={root}/wheels", "-e", f"gpuhpc_login_db_url=sqlite:///{db}",
            "-e", f"gpuhpc_ledger_data_dir={db.parent}", "-e", f"gpuhpc_ledger_log_file={root}/var/log/gpuhpc-ledger.log",
            "-e", f"gpuhpc_ledger_wrapper_path={root}/usr/local/sbin/gpuhpc-ledger-ingest",
            "-e", f"gpuhpc_ledger_systemd_dir={root}/etc/systemd/system",
            "-e", f"gpuhpc_ledger_textfile_dir={root}/var/lib/prometheus/node-exporter",
            "-e", f"gpuhpc_ledger_logrotate_dir={root}/etc/logrotate.d"]
    return root, prefix, args


def test_login_installs_the_site_config_and_the_ingest_timer(converged):
    root, prefix, first, tmp_path = converged["root"], converged["prefix"], converged["first"], converged["tmp"]
    db = root / "var" / "lib" / "gpuhpc" / "ledger.db"
    site = root / "etc" / "gpuhpc" / "config.toml"
    env = {"GPUHPC_SITE_CONFIG": str(site)}
    assert config.read_file(str(site), "site") == {
        "site": {"cluster_name": "dgxpod"}, "cmdserver": {"allowed": True}, "ledger": {"db_url": f"sqlite:///{db}"}}
    assert config.site_setting("site", "cluster_name", env) == "dgxpod"
    assert config.cmdserver({**env, "GPUHPC_CONFIG": str(tmp_path / "none.toml")}).enabled is False
    assert stat.S_IMODE(site.stat().st_mode) == 0o644
    assert stat.S_IMODE((root / "etc" / "gpuhpc" / "ledger").stat().st_mode) == 0o750    # the admin credential's
    assert (prefix / "constraints.txt").read_text() == (REPO / "constraints.txt").read_text()
    assert (root / "usr" / "local" / "bin" / "gpuhpc").resolve() == (Path(sys.prefix) / "bin" / "gpuhpc").resolve()
    assert db.is_file()                                      # `gpuhpc db upgrade` ran (gpuhpc_ledger)

    units = root / "etc" / "systemd" / "system"
    service = (units / "gpuhpc-ledger-ingest.service").read_text()
    timer = (units / "gpuhpc-ledger-ingest.timer").read_text()
    assert f"ExecStart={root}/usr/local/sbin/gpuhpc-ledger-ingest" in service and "Type=oneshot" in service
    assert "OnCalendar=*:0/15" in timer and "WantedBy=timers.target" in timer
    wrapper = (root / "usr" / "local" / "sbin" / "gpuhpc-ledger-ingest").read_text()
    assert f"{prefix}/venv/bin/gpuhpc ledger ingest" in wrapper
    assert ("ledger timer not started: systemd is not running on this host (no /run/systemd/system); "
            f"the units are in {units}") in first.stdout

    again = converged["again"]
    assert again.returncode == 0 and recap(again)["changed"] == 0, again.stdout[-3000:]


def test_login_installs_the_ledger_rollover_alerts_and_check_timers_with_textfiles(converged, tmp_path):
    """The ledger role's timers for today's commands: rollover every 2 minutes, alerts and check every
    15 (units rendered, not started here); the wrapper passes each command its own file in node_exporter's
    textfile directory (made 0755); a real rollover through the installed wrapper writes its figures; the
    commands' log is rotated by logrotate (copytruncate), checked with logrotate itself."""
    root, prefix = converged["root"], converged["prefix"]
    units = root / "etc" / "systemd" / "system"
    wrapper = root / "usr" / "local" / "sbin" / "gpuhpc-ledger-ingest"
    textfiles = root / "var" / "lib" / "prometheus" / "node-exporter"
    for what, calendar in (("rollover", "*:0/2"), ("alerts", "*:5/15"), ("check", "*:12/15")):
        service = (units / f"gpuhpc-ledger-{what}.service").read_text()
        timer = (units / f"gpuhpc-ledger-{what}.timer").read_text()
        assert f"\nExecStart={wrapper} {what}\n" in service and "Type=oneshot" in service, service
        assert f"\nOnCalendar={calendar}\n" in timer and "WantedBy=timers.target" in timer, timer
    assert stat.S_IMODE(textfiles.stat().st_mode) == 0o755

    # each command's argv, through the wrapper as the role rendered it, with a stand-in gpuhpc
    stub, argv = tmp_path / "gpuhpc", tmp_path / "argv"
    stub.write_text(f'#!/bin/bash\necho "$*" >> {argv}\n')
    stub.chmod(0o755)
    text = wrapper.read_text()
    assert f"{prefix}/venv/bin/gpuhpc ledger " in text
    stubbed = tmp_path / "wrapper"
    stubbed.write_text(text.replace(f"{prefix}/venv/bin/gpuhpc", str(stub)))
    stubbed.chmod(0o755)
    for what in ("ingest", "sync-slurm", "rollover", "alerts", "check"):
        r = subprocess.run([str(stubbed), what], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stdout + r.stderr
    assert argv.read_text().splitlines() == [
        f"ledger ingest --textfile {textfiles}/gpuhpc-ledger-ingest.prom",
        f"ledger sync-slurm --textfile {textfiles}/gpuhpc-ledger-sync-slurm.prom",
        f"ledger rollover --textfile {textfiles}/gpuhpc-ledger-rollover.prom",
        f"ledger alerts --textfile {textfiles}/gpuhpc-ledger-alerts.prom",
        f"ledger check --textfile {textfiles}/gpuhpc-ledger-check.prom"]
    assert subprocess.run([str(stubbed), "drop"], capture_output=True, timeout=30).returncode == 2

    # the real rollover (no database; no plan from sync-slurm yet: nothing to reset) writes its figures
    env = {"PATH": "/usr/bin:/bin", "GPUHPC_SITE_CONFIG": str(root / "etc" / "gpuhpc" / "config.toml"),
           "GPUHPC_CONFIG": str(tmp_path / "none.toml")}
    r = subprocess.run([str(wrapper), "rollover"], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "no reset plan at" in r.stderr, r.stdout + r.stderr
    prom = textfiles / "gpuhpc-ledger-rollover.prom"
    assert re.search(r"^gpuhpc_ledger_rollover_timestamp_seconds \d+$", prom.read_text(), re.M), prom.read_text()
    assert "gpuhpc_ledger_rollover_plan_timestamp_seconds 0\n" in prom.read_text()
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644                  # node_exporter reads it

    # the log the commands append to is rotated: logrotate, forced, on the installed file
    log = root / "var" / "log" / "gpuhpc-ledger.log"
    conf = root / "etc" / "logrotate.d" / "gpuhpc-ledger"
    assert f"{log} {{" in conf.read_text() and "copytruncate" in conf.read_text(), conf.read_text()
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("an old line\n")
    r = subprocess.run(["logrotate", "--force", "--state", str(tmp_path / "logrotate.state"), str(conf)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert log.read_text() == "" and (log.parent / "gpuhpc-ledger.log.1").read_text() == "an old line\n"


def test_the_ledger_role_refuses_a_relative_textfile_directory_naming_it(collection, tmp_path):
    """validate.yml: a bad value stops the play before anything is written, in one line naming the variable."""
    play = _playbook(tmp_path, "ledger-validate.yml", ("gpuhpc_ledger", "        tasks_from: validate.yml\n"))
    proc = _run(play, tmp_path, "-e", f"gpuhpc_ledger_bin={sys.executable}",
                "-e", "gpuhpc_ledger_textfile_dir=var/lib/prometheus/node-exporter")
    assert proc.returncode != 0
    assert ('"msg": "gpuhpc_ledger_textfile_dir=\\"var/lib/prometheus/node-exporter\\": give node_exporter\'s '
            'textfile collector directory as an absolute path (no spaces), or empty for none"') in proc.stdout, \
        proc.stdout[-3000:]


def test_login_on_a_fresh_host_in_check_mode_would_build_the_venv(check_mode):
    root, prefix, check = check_mode["root"], check_mode["prefix"], check_mode["proc"]
    assert _status(check.stdout, "Install gpuhpc into the venv") == "changed", check.stdout[-3000:]
    assert "cluster_name = \"dgxpod\"" in check.stdout                  # the config.toml diff
    assert not prefix.exists() and not (root / "etc" / "gpuhpc").exists()


def _status(stdout: str, task: str) -> str:
    """ok/changed/failed of the first task whose name starts with ``task``."""
    m = re.search(rf"TASK \[[^\]]*: {re.escape(task)}[^\n]*\n+(\w+):", stdout)
    assert m, f"no task {task!r} in the output"
    return m.group(1)
