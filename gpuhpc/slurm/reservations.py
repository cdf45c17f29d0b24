"""Maintenance reservations: the argv builders and the two calls (create, delete) the deep
health checks use to hold a node (:mod:`gpuhpc.health.deep`). Kept in a module of its own,
beside :mod:`gpuhpc.slurm.commands` and :class:`~gpuhpc.slurm.client.SlurmClient`, whose
conventions it follows (pure builders; execution through a client's runner)."""
from __future__ import annotations

import re
from collections.abc import Sequence

_WORD = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-\[\],]*$")


def _word(value: str, what: str) -> str:
    if not _WORD.match(value or ""):
        raise ValueError(f"reservation {what} {value!r}: letters, digits, '.', '_', '-', ',', '[]' only")
    return value


def create_argv(name: str, nodes: str, users: str, minutes: int,
                flags: Sequence[str] = ("MAINT", "IGNORE_JOBS")) -> list[str]:
    """``scontrol create reservation`` of ``nodes`` for ``users`` from now for ``minutes``.
    MAINT: accounted as maintenance; IGNORE_JOBS: made even while jobs run there (they run on;
    no job outside the reservation starts on the nodes from now on)."""
    argv = ["scontrol", "create", "reservation", f"ReservationName={_word(name, 'name')}",
            f"Nodes={_word(nodes, 'nodes')}", f"Users={_word(users, 'users')}", "StartTime=now",
            f"Duration={max(1, int(minutes))}"]
    if flags:
        argv.append(f"Flags={','.join(_word(f, 'flag') for f in flags)}")
    return argv


def delete_argv(name: str) -> list[str]:
    """``scontrol delete ReservationName=NAME``."""
    return ["scontrol", "delete", f"ReservationName={_word(name, 'name')}"]


def create(client, name: str, nodes: str, users: str, minutes: int) -> None:
    """Make the maintenance reservation (a SlurmError when slurmctld refuses it)."""
    client.run(create_argv(name, nodes, users, minutes))


def delete(client, name: str) -> bool:
    """Delete it; False when Slurm had none of that name (already gone, or never made)."""
    return client.run(delete_argv(name), check=False).ok
