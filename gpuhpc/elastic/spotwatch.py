"""The node-side spot notice watcher (docs/elastic.md, "Spot notices on the node"): on a spot
instance, poll the instance metadata's ``spot/instance-action`` every ``interval`` seconds (IMDSv2:
a session token first, renewed when it expires or the service answers 401) and, the moment EC2
announces the reclaim (two minutes ahead), drain the node and signal its jobs to checkpoint
(``USR2``, the batch shell too), within a poll of the notice instead of the reconciler's 0-60 s.
The reconciler then does the rest as for a notice it found itself (DOWN after the checkpoint
window, requeue, the instance ended).

    python -m gpuhpc.elastic.spotwatch --node NAME [--interval 2]

Runs as root on the node (``scontrol update`` and ``scancel`` of others' jobs need it), started
by the node's boot (a systemd unit beside slurmd). Only stdlib HTTP: no boto3 on the node."""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from gpuhpc.elastic.reconcile import CHECKPOINT_SIGNAL
from gpuhpc.slurm.power import PowerSlurm

IMDS = "http://169.254.169.254"
TOKEN_TTL = 21600
log = logging.getLogger("gpuhpc.elastic.spotwatch")


@dataclass(frozen=True)
class Notice:
    action: str          # terminate | stop | hibernate
    time: str            # when EC2 will act (UTC, ISO 8601)


class Imds:
    """IMDSv2 over plain HTTP (``base``: the service; a test passes its stand-in's address)."""

    def __init__(self, base: str = IMDS, timeout: float = 2.0) -> None:
        self.base, self.timeout, self.token = base.rstrip("/"), timeout, None

    def _token(self) -> str:
        req = urllib.request.Request(f"{self.base}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL)})
        with urllib.request.urlopen(req, timeout=self.timeout) as resp:
            return resp.read().decode()

    def get(self, path: str) -> str | None:
        """The metadata at ``path`` (under ``/latest/meta-data/``), None when there is none (404)."""
        for attempt in (0, 1):
            if self.token is None:
                self.token = self._token()
            req = urllib.request.Request(f"{self.base}/latest/meta-data/{path}",
                                         headers={"X-aws-ec2-metadata-token": self.token})
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    return resp.read().decode()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code == 401 and attempt == 0:     # the token expired: a new one, once
                    self.token = None
                    continue
                raise
        return None

    def instance_action(self) -> Notice | None:
        text = self.get("spot/instance-action")
        if not text:
            return None
        try:
            data = json.loads(text)
            return Notice(str(data["action"]), str(data.get("time", "")))
        except (ValueError, KeyError, TypeError):
            log.warning("unreadable instance-action %r", text[:200])
            return None


def act(node: str, notice: Notice, slurm, instance_id: str | None = None) -> list[str]:
    """Drain ``node`` and signal its jobs to checkpoint. Returns the jobs signalled."""
    what = f"spot interruption of {instance_id}" if instance_id else "spot interruption"
    slurm.drain(node, f"gpuhpc: {what} (node notice, {notice.action} at {notice.time})")
    jobs = sorted({job for job, _ in slurm.jobs_on(node)})
    if jobs:
        slurm.signal_jobs(jobs, CHECKPOINT_SIGNAL)
    log.warning("spot notice on %s (%s at %s): drained, %s to %s", node, notice.action, notice.time,
                CHECKPOINT_SIGNAL, jobs)
    return jobs


def watch(node: str, imds: Imds, slurm, *, interval: float = 2.0, sleep: Callable[[float], None] = time.sleep,
          stop: Callable[[], bool] = lambda: False) -> Notice | None:
    """Poll until a notice (acted on once, then returned) or ``stop()``. A metadata error is
    logged and polled again: the watcher never dies of one."""
    instance_id = None
    while not stop():
        try:
            if instance_id is None:
                instance_id = imds.get("instance-id")
            notice = imds.instance_action()
        except (OSError, urllib.error.URLError) as exc:
            log.warning("instance metadata: %s", exc)
            notice = None
        if notice is not None:
            act(node, notice, slurm, instance_id)
            return notice
        sleep(interval)
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuhpc.elastic.spotwatch", description=__doc__.splitlines()[0])
    ap.add_argument("--node", required=True, help="this node's Slurm name (its gpuhpc:node tag)")
    ap.add_argument("--interval", type=float, default=2.0)
    ap.add_argument("--imds", default=IMDS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    watch(args.node, Imds(args.imds), PowerSlurm(), interval=args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
