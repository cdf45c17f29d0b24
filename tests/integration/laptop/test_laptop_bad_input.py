"""Bad input in the S3 fields of a job file: one line, exit 2 (bad URL, empty prefix) or 1 (no
credentials), no traceback, and no job submitted. (Wrong profile, unreachable host and a
snapshot over the limit: test_laptop_profiles.py and test_laptop_snapshot.py.)"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from gpuhpc.staging.s3 import S3Stager

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def s3_env(sshd):
    out = subprocess.run(["bash", str(REPO / "scripts/services/s3.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


def _jobs_named(laptop, name, env):
    res = laptop.gpuhpc("jobs", "--json", env=env)
    assert res.returncode == 0, res.stderr
    return [j for j in json.loads(res.stdout) if j["name"] == name]


@pytest.mark.parametrize("inputs, code, words", [
    ({"http://bucket/ds/": "/tmp/ds"}, 2, "not an S3 URL: 'http://bucket/ds/'"),
    ({"s3:///ds/": "/tmp/ds"}, 2, "not an S3 URL"),
    ({"s3://BUCKET/ds/": "/tmp/ds"}, 1, "no S3 credentials found"),
    ({"s3://gpuhpc-no-such-bucket-x/ds/": "/tmp/ds"}, 1, "NoSuchBucket"),
    ({"s3://PROFILE/ds/": "/tmp/ds"}, 2, "config profile (gpuhpc-no-such-profile) could not be found"),
])
def test_bad_s3_fields_are_one_line_and_submit_nothing(laptop, s3_env, tmp_path, inputs, code, words):
    env = dict(s3_env)
    if "BUCKET" in next(iter(inputs)):
        env.update({"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                    "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"})
        S3Stager.from_env(s3_env).ensure_bucket("bucket-j-creds")
        inputs = {"s3://bucket-j-creds/ds/": "/tmp/ds"}
    if "PROFILE" in next(iter(inputs)):
        env.update({"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_PROFILE": "gpuhpc-no-such-profile"})
        inputs = {"s3://bucket-j-creds/ds/": "/tmp/ds"}
    name = f"bad-s3-{code}-{len(words)}"
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps({"name": name, "partition": "cpu", "time": "5m", "inputs": inputs,
                               "command": ["true"]}))
    res = laptop.gpuhpc("submit", "--file", str(job), env=env)
    assert res.returncode == code, res.stderr
    assert res.stderr.count("\n") == 1 and words in res.stderr and "Traceback" not in res.stderr
    assert _jobs_named(laptop, name, env) == []
