"""The power programs' records, one JSON file under ``power.state_dir``: which instance each node
has (also written to the node's Comment), when its resume was asked for, and the pools cooling
down after a capacity error. Every change holds an exclusive ``flock`` and replaces the file
atomically, so the resume, suspend and reconcile processes never lose each other's updates."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from gpuhpc.fsutil import write_atomic


@dataclass
class NodeRecord:
    node: str
    pool: str
    token: str
    requested_at: float
    instance_id: str | None = None
    launched_at: float | None = None
    job_id: str | None = None
    job_started: bool = False        # its job's submit -> running is journalled (monitoring)


@dataclass
class State:
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    cooldowns: dict[str, dict] = field(default_factory=dict)       # pool -> {"until": t, "code": ...}
    interrupted: dict[str, float] = field(default_factory=dict)    # node -> when the reclaim notice was acted on
    boot_failures: dict[str, int] = field(default_factory=dict)    # pool -> boot failures since its last good boot
    protected: dict[str, dict] = field(default_factory=dict)       # pool -> {"since": t, "failures": n}
    releasing: dict[str, float] = field(default_factory=dict)      # instance id -> when suspend/resume-fail forgot its node

    def to_json(self) -> str:
        # a record's fields are plain values: its __dict__, not asdict()'s deep copy (10,000 nodes)
        return json.dumps({"nodes": {k: dict(vars(v)) for k, v in self.nodes.items()},
                           "cooldowns": self.cooldowns, "interrupted": self.interrupted,
                           "boot_failures": self.boot_failures, "protected": self.protected,
                           "releasing": self.releasing}, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> "State":
        data = json.loads(text) if text.strip() else {}
        return cls(nodes={k: NodeRecord(**v) for k, v in (data.get("nodes") or {}).items()},
                   cooldowns=dict(data.get("cooldowns") or {}), interrupted=dict(data.get("interrupted") or {}),
                   boot_failures=dict(data.get("boot_failures") or {}), protected=dict(data.get("protected") or {}),
                   releasing=dict(data.get("releasing") or {}))


class Store:
    def __init__(self, state_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(state_dir)
        self.path = self.dir / "state.json"

    def read(self) -> State:
        try:
            return State.from_json(self.path.read_text())
        except FileNotFoundError:
            return State()

    @contextlib.contextmanager
    def update(self) -> Iterator[State]:
        """The state under the lock; written back when the block ends without an exception."""
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "state.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = self.read()
            yield state
            write_atomic(self.path, state.to_json(), mode=0o600)
