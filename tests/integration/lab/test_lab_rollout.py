"""Rollouts on the lab's systemd hosts (see conftest.py): a node-definition change whose slurmd does
not start on one host still brings every other slurmd back at once, and a slurmd whose scratch is
missing does not start: its node is drained with the reason, and resumed once the scratch is back.

Runs after test_lab.py's node-definition change (the cluster then runs its spec, with the lab-order
feature): this change gives the nodes another feature.
"""
from __future__ import annotations

import pytest

from polling import wait_for

from .conftest import Lab, recap
from .test_lab import _lab_spec, _node_states

pytestmark = pytest.mark.integration

# a node feature: slurm.conf's NodeName lines change, which stops slurmd, restarts slurmctld, starts slurmd
ROLLOUT_FEATURE = ("    memory_mb: 2000\n", "    memory_mb: 2000\n    features: [lab-rollout]\n")
# c1's slurmd cannot start (as on a host with a broken disk or driver): a drop-in of the test's
BROKEN = "/etc/systemd/system/slurmd.service.d/zz-test-broken.conf"
MISSING = "/etc/systemd/system/slurmd.service.d/zz-test-missing-scratch.conf"
PRECHECK = "/usr/bin/env SLURM_CONF=/etc/slurm/slurm.conf /usr/local/sbin/gpuhpc-slurmd-precheck"


def _reason(lab: Lab, node: str) -> str:
    """The node's Reason= (scontrol show node), '' without one."""
    out = lab.ssh("ctl", f"scontrol show node {node}")
    return next((line.split("=", 1)[1] for line in out.splitlines() if line.strip().startswith("Reason=")), "")


def test_a_node_definition_change_starts_every_other_slurmd_when_one_host_fails(lab: Lab, tmp_path):
    lab.ssh("c1", f"printf '[Service]\\nExecStartPre=/bin/false\\n' > {BROKEN} && systemctl daemon-reload")
    try:
        spec = _lab_spec(tmp_path, ROLLOUT_FEATURE)
        # restart_batch=1 is what the batched rollout had to be given to fail here: c1's batch failed,
        # and c2's never started (it is no setting any more)
        proc = lab.timed("rollout_play_s", lab.play, "-e", f"gpuhpc_slurm_common_spec={spec}",
                         "-e", "gpuhpc_slurm_compute_restart_batch=1")
        out = proc.stdout
        assert proc.returncode != 0, out[-3000:]
        rows = recap(out)
        assert rows["c1"]["failed"] == 1 and all(rows[h]["failed"] == 0 for h in ("ctl", "login", "c2")), rows
        # slurmd stopped on both before slurmctld restarted; c2's came back with the new definition
        assert lab.ssh("c2", "systemctl is-active slurmd").strip() == "active"
        wait_for(lambda: _node_states(lab).get("c2") == "idle", 90, "c2 to register with the new definition")
        assert "AvailableFeatures=lab-rollout" in lab.ssh("ctl", "scontrol show node c2")
        # c1's failure is named, with the rescue's second start that failed too
        assert "failed on c1" in out and "slurmd was stopped for this change and is started again" in out, out[-3000:]
    finally:
        lab.ssh("c1", f"rm -f {BROKEN} && systemctl daemon-reload && systemctl start slurmd")
    wait_for(lambda: _node_states(lab).get("c1") == "idle", 90, "c1 to come back once its slurmd starts")
    assert "AvailableFeatures=lab-rollout" in lab.ssh("ctl", "scontrol show node c1")


def test_slurmd_without_its_scratch_does_not_start_and_drains_the_node_with_the_reason(lab: Lab):
    # the lab's /scratch is a mount point that cannot go away under a running host: c2's slurmd gets
    # the check gpuhpc_nvme_scratch's drop-in runs (test_lab.py's reboot test reads it) for a scratch
    # that is missing, as a host whose drive died would
    lab.ssh("c2", f"printf '[Service]\\nExecStartPre={PRECHECK} c2 dir:/scratch-missing\\n' > {MISSING}"
                  " && systemctl daemon-reload")
    try:
        assert lab.sh("ssh", "c2", "systemctl restart slurmd", check=False).returncode != 0
        assert lab.ssh("c2", "systemctl is-active slurmd || true").strip() != "active"
        wait_for(lambda: _reason(lab, "c2").startswith("gpuhpc precheck: scratch /scratch-missing is missing"), 60,
                 "c2 drained with the reason")
        assert "drain" in _node_states(lab)["c2"]
    finally:
        lab.ssh("c2", f"rm -f {MISSING} && systemctl daemon-reload && systemctl start slurmd")
    # the role's own check passes at the next start and lifts its drain
    wait_for(lambda: _node_states(lab).get("c2") == "idle", 90, "c2 to be resumed and idle")
    assert "gpuhpc precheck" not in _reason(lab, "c2")
