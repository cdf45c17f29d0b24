"""Two controllers (SlurmctldHost primary and backup): which one acts.

Both controllers carry the power programs and the reconciler's timer, but only the slurmctld in
charge runs ResumeProgram/SuspendProgram, and only the reconciler on the controller in charge may
act: a standby's local records know nothing of the instances the other one launched, and read as
orphans there they would all be terminated. The controller in charge is the first SlurmctldHost,
in slurm.conf's order, that answers ``scontrol ping`` (a backup takes over only while every host
before it is silent, and hands control back when the primary returns; a standby backup answers
pings too, so "UP" alone says nothing). Pure: recorded ``scontrol ping`` output in, a verdict out
(tests/unit/elastic/test_ha.py)."""
from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from gpuhpc.config import getenv
from gpuhpc.slurm.parsers import ControllerPing

HOST_ENV = "GPUHPC_ELASTIC_HOST"      # this controller's SlurmctldHost name, where gethostname() differs


@dataclass(frozen=True)
class Verdict:
    acts: bool              # this host is the controller in charge
    in_charge: str | None   # the controller in charge (None: none answered)
    reason: str


def this_host() -> str:
    return getenv(HOST_ENV) or socket.gethostname()


def same_host(a: str, b: str) -> bool:
    """Host names equal, or equal short names (SlurmctldHost may be short or qualified)."""
    a, b = a.lower().rstrip("."), b.lower().rstrip(".")
    return a == b or a.split(".", 1)[0] == b.split(".", 1)[0]


def in_charge(controllers: Sequence[ControllerPing]) -> ControllerPing | None:
    """The first controller in SlurmctldHost order that answers the ping."""
    return next((c for c in controllers if c.up), None)


def verdict(controllers: Sequence[ControllerPing], host: str) -> Verdict:
    """Whether the reconciler on ``host`` may act, from ``scontrol ping``'s controllers."""
    if not controllers:
        return Verdict(False, None, "scontrol ping named no controller")
    boss = in_charge(controllers)
    if boss is None:
        return Verdict(False, None, "no controller answers scontrol ping")
    if same_host(boss.host, host):
        return Verdict(True, boss.host, f"{host} is the controller in charge ({boss.role})")
    mine = next((c for c in controllers if same_host(c.host, host)), None)
    what = f"the {mine.role} controller" if mine else "no SlurmctldHost"
    return Verdict(False, boss.host, f"{host} is {what}; {boss.host} ({boss.role}) is in charge")
