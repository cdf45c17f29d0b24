"""Slurm's reading of every time in the duration table equals gpuhpc's: each is submitted as a
held job's ``--time`` (never runs), read back from squeue's time limit, and cancelled.

Slurm keeps time limits in whole minutes, rounding up: ``0:05`` becomes ``1:00``."""
from __future__ import annotations

import pytest
from durations_cases import SLURM_TIMES

from gpuhpc.slurm import SlurmClient
from gpuhpc.slurm.durations import reported_seconds

pytestmark = pytest.mark.integration


def test_slurm_reads_the_table_as_we_do():
    client = SlurmClient()
    ids: list[str] = []
    try:
        got = {}
        for text, _ in SLURM_TIMES:
            job = client.submit_script("#!/bin/sh\ntrue\n", extra=["--hold", "--partition=cpu", f"--time={text}",
                                                                   "--job-name=gpuhpc-durations", "--output=/dev/null"])
            ids.append(job)
            got[text] = job
        rows = {r.job_id: r for r in client.queue(job_ids=ids)}
        for text, seconds in SLURM_TIMES:
            expected = None if seconds is None else -(-seconds // 60) * 60
            assert reported_seconds(rows[got[text]].time_limit) == expected, (text, rows[got[text]].time_limit)
    finally:
        for job in ids:
            client.cancel(job)
