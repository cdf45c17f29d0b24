"""gpuhpc.cluster.slurm_upgrade_refusal: why an upgrade from one Slurm release to another must not run.

    installed_version | gpuhpc.cluster.slurm_upgrade_refusal(target_version)

Both are version strings as hosts and packages print them (``slurm 24.11.5``, ``24.11.5-4+deb13u1``,
``25.11.7-1+gpuhpc.6f53...``); only major.minor counts. The result is "" when the upgrade may run,
else one line saying why and what to do. Slurm's daemons read the state (StateSaveLocation, the
accounting database, a running job's credentials) of the previous three releases only, so a jump
past them loses the cluster's state; a move back reads state from the future. A host whose
installed release cannot be read (a fresh host) is no refusal. Pure Python, no Ansible import:
tests/unit/conf/test_slurm_upgrade.py loads this file directly.
"""
from __future__ import annotations

import re

# Slurm's releases in order (two a year since 23.02: .05 and .11; before that 20.02, 20.11, 21.08, 22.05)
EARLY = ((20, 2), (20, 11), (21, 8), (22, 5))
WINDOW = 3          # a release reads the state of this many releases before it


def release(version: str) -> tuple[int, int] | None:
    m = re.search(r"(\d+)\.(\d+)", str(version or ""))
    return (int(m.group(1)), int(m.group(2))) if m else None


def ordinal(rel: tuple[int, int]) -> int | None:
    """The release's place in Slurm's sequence (None for one that is no Slurm release)."""
    if rel in EARLY:
        return EARLY.index(rel)
    year, month = rel
    if year == 23 and month == 2:
        return len(EARLY)
    if year >= 23 and month in (5, 11) and (year, month) != (23, 5):
        # 23.11 follows 23.02; from 24 on, YY.05 then YY.11
        return len(EARLY) + 1 + (0 if (year, month) == (23, 11) else 1 + 2 * (year - 24) + (month == 11))
    return None


def slurm_upgrade_refusal(installed: str, target: str) -> str:
    old, new = release(installed), release(target)
    if new is None or ordinal(new) is None:
        return (f"gpuhpc_slurm_common_version={target!r} names no Slurm release (YY.MM, e.g. 24.11.5-4+deb13u1): "
                "give the Debian version every Slurm package moves to")
    if old is None or ordinal(old) is None:
        return ""
    a, b = ordinal(old), ordinal(new)
    name = lambda r: f"{r[0]}.{r[1]:02d}"          # noqa: E731
    if b < a:
        return (f"Slurm {name(old)} -> {name(new)} is a downgrade: a release cannot read the state a later one "
                "wrote; restore the backups the upgrade made instead")
    if b - a > WINDOW:
        steps = [r for r in (*EARLY, (23, 2), (23, 11), *((y, m) for y in range(24, new[0] + 1) for m in (5, 11)))
                 if ordinal(r) is not None and a < ordinal(r) <= a + WINDOW]
        return (f"Slurm {name(old)} -> {name(new)} skips {b - a - 1} releases: a release reads the state of the "
                f"previous {WINDOW} only; upgrade to {' or '.join(name(r) for r in steps)} first, then on")
    return ""


class FilterModule:
    """gpuhpc.cluster filters."""

    def filters(self):
        return {"slurm_upgrade_refusal": slurm_upgrade_refusal}
