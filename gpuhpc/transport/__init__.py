"""Where commands run: locally (subprocess) or on a remote login node (SSH).

Everything that talks to Slurm goes through a :class:`Runner`, so the same builders and
parsers serve the login node and a laptop over SSH.
"""
from __future__ import annotations

from gpuhpc.transport.base import CommandResult, Runner

__all__ = ["CommandResult", "Runner", "default_runner"]


def default_runner() -> Runner:
    """The one place that picks where commands run: over SSH to the cluster profile
    ``GPUHPC_CLUSTER`` names (``gpuhpc --cluster NAME`` sets it) or to ``GPUHPC_SSH_HOST``
    (laptop -> login node; one connection per process, closed at exit), else locally."""
    from gpuhpc.config import getenv

    if getenv("GPUHPC_CLUSTER") or getenv("GPUHPC_SSH_HOST"):
        from gpuhpc.transport.ssh import shared_runner

        return shared_runner()
    from gpuhpc.transport.local import LocalRunner

    return LocalRunner()
