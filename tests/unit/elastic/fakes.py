"""A recording stand-in for :class:`gpuhpc.slurm.power.PowerSlurm`'s node calls (the worker's and
the reconciler's side of Slurm in the elastic unit tests): answers ``nodes`` from a list, records
every change it is asked for in ``calls``."""
from __future__ import annotations


class RecordingSlurm:
    def __init__(self, nodes=()):
        self.node_list, self.calls = list(nodes), []

    def nodes(self, names=None):
        return self.node_list

    def down(self, nodes, reason):
        self.calls.append(("down", nodes, reason))
        return True

    def resume(self, nodes):
        self.calls.append(("resume", nodes))
        return True

    def power_down(self, nodes, force=True):
        self.calls.append(("power_down", nodes))
        return True

    def update(self, node, **fields):
        self.calls.append(("update", node, fields))
        return True
