"""What the health tests that drive gpu-node1 of the local cluster share: one run of the regular
checks as HealthCheckProgram starts it, the node's state in Slurm, and the fixture body that
refuses a node drained before the test and undoes gpuhpc's own drain afterwards."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

NODE = "gpu-node1"


class HealthNode:
    """gpu-node1 with the test's environment (``env``: stand-ins first on PATH) and a SlurmClient
    (``client``); subclasses set both up."""

    env: dict[str, str]

    def regular(self, spec: Path) -> tuple[int, dict]:
        """One run of the full checks with --apply, as HealthCheckProgram starts it."""
        proc = subprocess.run([sys.executable, "-m", "gpuhpc.health", "--node", NODE, "--apply", "--json",
                               "--spec", str(spec)], env=self.env, capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 1) and proc.stdout, proc.stdout + proc.stderr
        out = json.loads(proc.stdout)
        out["status"] = {r["check"]: (r["status"], r["message"]) for r in out["results"]}
        return proc.returncode, out

    def state(self) -> tuple[str, str]:
        n = self.client.node(NODE)
        return n.state, n.reason

    def drained(self) -> bool:
        return "DRAIN" in self.state()[0]


def undrained(node: HealthNode) -> Iterator[HealthNode]:
    """A fixture's body: the node must not be drained already (the test would not see its own
    drain); gpuhpc's drain of it is undone afterwards (the node is shared with other tests)."""
    state, reason = node.state()
    assert "DRAIN" not in state, f"{NODE} is drained already ({reason}): the test would not see its own drain"
    yield node
    state, reason = node.state()
    if "DRAIN" in state and reason.startswith("gpuhpc:"):
        node.client.resume_node(NODE)
