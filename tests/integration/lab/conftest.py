"""The multi-host lab (scripts/lab.sh): four Debian 13 hosts with Slurm 24.11 (GPUHPC_LAB_SUITE=bookworm:
Debian 12, 22.05) on this machine, each with systemd as its
PID 1 in its own network/mount/PID/UTS namespaces, stood up from a fresh overlay and deployed with
the installed gpuhpc.cluster collection over real SSH (host keys checked), in systemd service mode.

Runs as its own stage of scripts/test.sh (after the main pytest); it needs root. The lab never
touches the shared local cluster: its addresses live in namespaces it creates (10.213.0.0/24).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ansible_helpers import ansible_env

REPO = Path(__file__).resolve().parents[3]
LAB_SH = REPO / "scripts" / "lab.sh"
INVENTORY = "ansible/inventories/lab"
LAB_DIR = Path(os.environ.get("GPUHPC_LAB_DIR", "/var/tmp/gpuhpc-lab"))
SHARED = LAB_DIR / "shared"        # /shared on every lab host (scripts/lab.sh)


def recap(text: str) -> dict[str, dict[str, int]]:
    """host -> {ok, changed, unreachable, failed} of the last PLAY RECAP."""
    out: dict[str, dict[str, int]] = {}
    for line in text[text.rindex("PLAY RECAP"):].splitlines()[1:]:
        m = re.match(r"^(\S+)\s+:\s+(.*)$", line)
        if m:
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    return out


@dataclass
class Lab:
    timings: dict[str, float] = field(default_factory=dict)

    def sh(self, *args: str, timeout: float = 300, check: bool = True, stdin: str | None = None
           ) -> subprocess.CompletedProcess:
        proc = subprocess.run(["bash", str(LAB_SH), *args], cwd=REPO, env=ansible_env(), input=stdin,
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert proc.returncode == 0, f"lab.sh {' '.join(args)}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        return proc

    def ssh(self, host: str, command: str, check: bool = True, timeout: float = 120, stdin: str | None = None) -> str:
        """Run a shell command on a lab host over SSH (host key checked); its stdout."""
        return self.sh("ssh", host, command, check=check, timeout=timeout, stdin=stdin).stdout

    def sbatch(self, script: str) -> str:
        """Submit a batch script (gpuhpc renders it here) with sbatch on the login host; the job id."""
        return self.ssh("login", "sbatch --parsable", stdin=script).strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """The job's state from the controller (squeue while it is known there, else sacct)."""
        out = self.ssh("ctl", f"squeue --noheader --jobs {job_id} --format %T 2>/dev/null || true").strip()
        return out or self.ssh("ctl", f"sacct -nX -P -o State -j {job_id}").strip().split(" ")[0]

    def play(self, *extra: str, timeout: float = 900, playbook: str = "gpuhpc.cluster.site") -> subprocess.CompletedProcess:
        """A playbook (gpuhpc.cluster.site) of the installed collection, run by a control node in the lab."""
        return subprocess.run(["bash", str(LAB_SH), "ctl", "ansible-playbook", "-i", INVENTORY,
                               playbook, *extra],
                              cwd=REPO, env=ansible_env(), capture_output=True, text=True, timeout=timeout)

    def popen_play(self, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(["bash", str(LAB_SH), "ctl", "ansible-playbook", "-i", INVENTORY,
                                 "gpuhpc.cluster.site", *extra],
                                cwd=REPO, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def timed(self, name: str, fn, *args, **kw):
        t = time.monotonic()
        try:
            return fn(*args, **kw)
        finally:
            self.timings[name] = round(time.monotonic() - t, 1)


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    """Bake the image (once, cached), boot the four hosts from a fresh overlay, deploy site.yml."""
    if os.geteuid() != 0:
        pytest.skip("the multi-host lab needs root (network, mount and PID namespaces)")
    lab = Lab()
    proc = subprocess.run(["bash", "scripts/cluster.sh", "install"], cwd=REPO, env=ansible_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # GPUHPC_LAB_REUSE=1 (while working on the tests): keep a lab that is up and deployed
    if os.environ.get("GPUHPC_LAB_REUSE") != "1" or lab.sh("status", check=False).returncode != 0:
        lab.timed("bake_s", lab.sh, "bake", timeout=1800)
        lab.sh("wipe")
        lab.timed("up_s", lab.sh, "up")
        first = lab.timed("first_play_s", lab.play)
        assert first.returncode == 0, first.stdout[-6000:]
    try:
        yield lab
    finally:
        (LAB_DIR / "timings.json").write_text(json.dumps(lab.timings, indent=1))
        sys.stderr.write(f"\nlab timings: {json.dumps(lab.timings)}\n")
        if os.environ.get("GPUHPC_LAB_KEEP") != "1" and os.environ.get("GPUHPC_LAB_REUSE") != "1":
            lab.sh("down", check=False)
