"""Rolling reboots (``gpuhpc node reboot``, docs/admin.md "Rolling reboots"): Slurm's
``reboot ASAP nextstate=RESUME reason=...`` in batches, and the wait for each node to come back.

Slurm does the work: ASAP drains the node (its running jobs finish, no new one starts), has slurmd
run RebootProgram once it is idle, and with ``nextstate=RESUME`` returns it to service when its
slurmd registers again; a node that does not register within ResumeTimeout goes DOWN. This module
builds the argv (pure), reads each node's state and BootTime (pure parser over ``scontrol
--oneliner show node``), decides whether a node is back (:func:`progress`) and runs the batches
(:func:`rollout`) through a :class:`~gpuhpc.slurm.client.SlurmClient`.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpuhpc.errors import GpuhpcError, UserInputError
from gpuhpc.slurm.commands import scontrol_show
from gpuhpc.slurm.parsers import parse_oneliner_records, slurm_timestamp

REASON_MAX = 200
_BAD_REASON = re.compile(r"[\x00-\x1f\x7f\"']")
# flags Slurm shows while a reboot is pending (ASAP: REBOOT_REQUESTED, with DRAIN) or under way
# (REBOOT_ISSUED); 23.02 and later may also show REBOOT alone
REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})
SERVING = frozenset({"IDLE", "MIXED", "ALLOCATED"})       # a node back in service
UNUSABLE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING",
                      "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "MAINTENANCE", "INVALID_REG"})


# ---------------------------------------------------------------- builders and checks (pure)
def check_reason(reason: str | None) -> str:
    """The reason Slurm records on the node (``scontrol show node``'s Reason=): one printable line,
    no quotes (Slurm's own parser would cut it there), at most 200 characters."""
    text = (reason or "").strip()
    if not text:
        raise UserInputError("the reason is empty", field="--reason",
                             hint='say why the nodes reboot, e.g. --reason "driver 550.90 update"')
    if _BAD_REASON.search(text) or len(text) > REASON_MAX:
        raise UserInputError(f"the reason must be one line of at most {REASON_MAX} characters without "
                             "quotes or control characters", field="--reason")
    return text


def check_batch(batch: int) -> int:
    if batch <= 0:
        raise UserInputError(f"batch size {batch} is not positive", field="--batch",
                             hint="how many nodes reboot at once, e.g. --batch 4")
    return batch


def reboot_argv(nodes: str, reason: str) -> list[str]:
    """``scontrol reboot ASAP nextstate=RESUME reason=REASON NODES``: each word one argv element (no
    shell sees the reason); the reason is checked (:func:`check_reason`)."""
    return ["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={check_reason(reason)}", nodes]


def batches(nodes: Sequence[str], size: int) -> list[list[str]]:
    """``nodes`` in order, ``size`` at a time."""
    check_batch(size)
    return [list(nodes[i:i + size]) for i in range(0, len(nodes), size)]


@dataclass(frozen=True)
class NodeBoot:
    """A node as a reboot sees it: Slurm's state words (``IDLE+DRAIN+REBOOT_REQUESTED``), the reason,
    and BootTime (epoch seconds; None when Slurm has none)."""
    name: str
    state: str
    reason: str = ""
    boot_time: float | None = None

    @property
    def base(self) -> str:
        return self.state.split("+", 1)[0].rstrip("*~#!%$@^-").upper()

    @property
    def flags(self) -> frozenset[str]:
        words = self.state.upper().split("+")
        out = set(words[1:])
        if words[0].endswith("*"):          # Slurm's mark of a node that does not answer
            out.add("NOT_RESPONDING")
        return frozenset(out)


def parse_node_boots(text: str) -> dict[str, NodeBoot]:
    """``scontrol --oneliner show node [NODES]`` -> {name: NodeBoot}."""
    out = {}
    for rec in parse_oneliner_records(text):
        if "NodeName" in rec:
            reason = rec.get("Reason", "")
            out[rec["NodeName"]] = NodeBoot(rec["NodeName"], rec.get("State", "UNKNOWN"),
                                            "" if reason == "(null)" else reason, slurm_timestamp(rec.get("BootTime")))
    return out


def progress(before: NodeBoot, now: NodeBoot) -> str:
    """Where a node's reboot stands, from its record before the request and now:
    ``back`` (booted since: BootTime later than before, in service, no drain or reboot flag left),
    ``settled`` (booted since and Slurm is done with the reboot, but the node is not in service:
    still drained, DOWN: nextstate was not RESUME, or a health check drained it), ``down`` (DOWN or
    FAIL with no reboot pending: it did not come back within ResumeTimeout) or ``pending``."""
    booted = now.boot_time is not None and (before.boot_time is None or now.boot_time > before.boot_time)
    rebooting = bool(now.flags & REBOOT_FLAGS)
    if booted and not rebooting:
        if now.base in SERVING and not now.flags & UNUSABLE:
            return "back"
        return "settled"
    if not rebooting and (now.base in ("DOWN", "FAIL") or {"DOWN", "FAIL"} & now.flags):
        return "down"
    return "pending"


# ---------------------------------------------------------------- the rollout (through a client)
@dataclass
class Rollout:
    """What a rollout did: ``rebooted`` came back, ``failed`` (node, why) stopped it, ``requested``
    are the reboots asked of Slurm (the failed batch's included), ``untouched`` were never asked."""
    rebooted: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)
    untouched: list[str] = field(default_factory=list)


def read_nodes(client, nodes: str | None = None) -> dict[str, NodeBoot]:
    res = client.run(scontrol_show("node", nodes))
    return parse_node_boots(res.stdout)


def rollout(client, nodes: Sequence[str], *, batch: int, reason: str, wait: bool = True,
            timeout: float | None = None, poll: float = 5.0, settle: float = 30.0,
            report: Callable[[str], None] = lambda line: None,
            clock: Callable[[], float] | None = None, sleep: Callable[[float], None] | None = None) -> Rollout:
    """Reboot ``nodes`` (names Slurm knows) ``batch`` at a time. With ``wait``, each batch must be
    back (:func:`progress`) before the next is asked; the first node that goes DOWN, settles out of
    service for ``settle`` seconds, or is not back ``timeout`` seconds after its batch was asked
    (None: as long as Slurm takes) stops the rollout: the later batches are not rebooted."""
    reason = check_reason(reason)
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    out = Rollout()
    plan = batches(list(nodes), batch)
    for i, group in enumerate(plan):
        hostlist_arg = ",".join(group)
        before = read_nodes(client, hostlist_arg)
        res = client.run(reboot_argv(hostlist_arg, reason), check=False)
        if not res.ok:          # e.g. no RebootProgram in slurm.conf, or not a Slurm admin
            why = "; ".join(line.strip() for line in (res.stderr or res.stdout).splitlines() if line.strip())
            done = f" (rebooted before: {','.join(out.rebooted)})" if out.rebooted else ""
            raise GpuhpcError(f"Slurm refused to reboot {hostlist_arg}: {why or f'exit {res.returncode}'}{done}")
        out.requested.extend(group)
        report(f"batch {i + 1}/{len(plan)}: reboot requested for {hostlist_arg} (ASAP: after their running jobs)")
        if not wait:
            continue
        start = clock()
        waiting = set(group)
        settled_since: dict[str, float] = {}
        while waiting:
            now = read_nodes(client, hostlist_arg)
            for name in sorted(waiting):
                node = now.get(name)
                if node is None:
                    out.failed.append((name, "Slurm no longer knows it"))
                    continue
                state = progress(before[name], node)
                if state == "back":
                    waiting.discard(name)
                    out.rebooted.append(name)
                    report(f"{name}: back ({node.state})")
                elif state == "down":
                    out.failed.append((name, f"did not come back: {node.state}"
                                       + (f" ({node.reason})" if node.reason else "")))
                elif state == "settled":
                    first = settled_since.setdefault(name, clock())
                    if clock() - first >= settle:
                        out.failed.append((name, f"rebooted but not returned to service: {node.state}"
                                           + (f" ({node.reason})" if node.reason else "")))
                else:
                    settled_since.pop(name, None)
            failed_now = {n for n, _ in out.failed}
            waiting -= failed_now
            if out.failed:
                break
            if waiting and timeout is not None and clock() - start >= timeout:
                for name in sorted(waiting):
                    node = now.get(name)
                    out.failed.append((name, f"not back after {timeout:g} s: {node.state if node else '?'}"
                                       + (f" ({node.reason})" if node and node.reason else "")))
                break
            if waiting:
                sleep(poll)
        if out.failed:
            out.untouched = [n for g in plan[i + 1:] for n in g]
            break
    return out
