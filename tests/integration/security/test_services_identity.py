"""Point 12: the test services do not share one identity. PostgreSQL asks every connection for a
password (no ``trust``: any local user was superuser); S3 has an admin and a one-bucket user
identity with generated secrets, so a user's key cannot replace another's checkpoint, and no key
is in the repository."""
from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[3]

_S3_ATTACK = """
import sys, boto3, botocore
endpoint, access, secret, bucket = sys.argv[1:5]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=access, aws_secret_access_key=secret,
                  region_name="us-east-1")
for what, call in (("put", lambda: s3.put_object(Bucket=bucket, Key="ckpt.pkl", Body=b"evil")),
                   ("get", lambda: s3.get_object(Bucket=bucket, Key="ckpt.pkl")),
                   ("delete", lambda: s3.delete_object(Bucket=bucket, Key="ckpt.pkl"))):
    try:
        call()
        print(what, "allowed")
    except botocore.exceptions.ClientError as exc:
        print(what, exc.response["Error"]["Code"])
"""


def _weed_ports(endpoint: str) -> list[int]:
    """The other TCP ports of the weed process that serves ``endpoint``'s port."""
    s3_port = int(endpoint.rsplit(":", 1)[1])
    rows = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    pid = next(r.split("pid=", 1)[1].split(",", 1)[0] for r in rows if r.split()[3].endswith(f":{s3_port}"))
    ports = {int(r.split()[3].rsplit(":", 1)[1]) for r in rows if f"pid={pid}," in r}
    assert len(ports) > 3, ports
    return sorted(ports - {s3_port})


def test_postgres_wants_a_password_from_everyone(hostile):
    url = make_url(os.environ["GPUHPC_TEST_PG_URL"])     # root's: its password in the URL or root's ~/.pgpass
    ok = subprocess.run(["psql", "-h", url.host, "-p", str(url.port), "-U", url.username, "-d", url.database, "-w",
                         "-qtAc", "select 1"], env={**os.environ, **({"PGPASSWORD": url.password} if url.password else {})},
                        capture_output=True, text=True, timeout=60)
    assert ok.stdout.strip() == "1", ok.stderr
    for user, password in (("postgres", ""), ("postgres", "guess"), (hostile.name, "")):
        r = hostile.run(["psql", "-h", url.host, "-p", str(url.port), "-U", user, "-d", url.database, "-w",
                         "-qtAc", "select 1"], env={"PGPASSWORD": password} if password else None)
        assert r.returncode != 0 and r.stdout.strip() != "1", (user, r.stdout, r.stderr)
        assert "password" in r.stderr, r.stderr


def test_a_users_s3_key_cannot_touch_the_admins_bucket(hostile, site_python):
    out = subprocess.run(["bash", str(REPO / "scripts/services/s3.sh"), "start"], check=True, capture_output=True,
                         text=True, timeout=300).stdout.strip().splitlines()[-1]
    env = dict(kv.split("=", 1) for kv in out.split())
    if "GPUHPC_TEST_S3_USER_ACCESS_KEY_ID" not in env:
        pytest.fail("the S3 store has one identity (started by an older s3.sh): scripts/services/s3.sh wipe; "
                    "scripts/services/s3.sh start", pytrace=False)
    assert env["AWS_SECRET_ACCESS_KEY"] not in (REPO / "scripts/services/s3.sh").read_text()
    import boto3

    admin = boto3.client("s3", endpoint_url=env["GPUHPC_S3_ENDPOINT_URL"], region_name="us-east-1",
                         aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    bucket = f"gpuhpc-sec-{uuid.uuid4().hex[:10]}"
    admin.create_bucket(Bucket=bucket)
    try:
        admin.put_object(Bucket=bucket, Key="ckpt.pkl", Body=b"good")
        user = (env["GPUHPC_TEST_S3_USER_ACCESS_KEY_ID"], env["GPUHPC_TEST_S3_USER_SECRET_ACCESS_KEY"])
        for access, secret in (user, ("nobody", "not-a-secret-0123456789")):
            r = hostile.run([site_python, "-P", "-c", _S3_ATTACK, env["GPUHPC_S3_ENDPOINT_URL"], access, secret, bucket])
            assert r.returncode == 0, r.stderr
            assert "allowed" not in r.stdout and r.stdout.count("\n") == 3, r.stdout
        anon = hostile.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-X", "PUT", "--data", "evil",
                            f"{env['GPUHPC_S3_ENDPOINT_URL']}/{bucket}/ckpt.pkl"])
        assert anon.stdout.strip() in ("401", "403"), anon.stdout
        # nor around S3: every other port of the same weed (master, volume, filer: HTTP, HTTPS, gRPC)
        for port in _weed_ports(env["GPUHPC_S3_ENDPOINT_URL"]):
            for path in (f"/col/delete?collection={bucket}", f"/buckets/{bucket}/ckpt.pkl"):
                for method in ("GET", "PUT", "DELETE"):
                    r = hostile.run(["curl", "-s", "-m", "3", "-o", "/dev/null", "-w", "%{http_code}", "-X", method,
                                     "--data", "evil", f"http://127.0.0.1:{port}{path}"])
                    assert not r.stdout.startswith("2"), (port, method, path, r.stdout)
        assert admin.get_object(Bucket=bucket, Key="ckpt.pkl")["Body"].read() == b"good"
        # the user's own bucket works with the user's key: the identity is real, not just closed
        ub = env["GPUHPC_TEST_S3_USER_BUCKET"]
        try:
            admin.create_bucket(Bucket=ub)
        except admin.exceptions.ClientError:
            pass
        own = boto3.client("s3", endpoint_url=env["GPUHPC_S3_ENDPOINT_URL"], region_name="us-east-1",
                           aws_access_key_id=user[0], aws_secret_access_key=user[1])
        own.put_object(Bucket=ub, Key=f"{bucket}.txt", Body=b"mine")
        own.delete_object(Bucket=ub, Key=f"{bucket}.txt")
    finally:
        for obj in admin.list_objects_v2(Bucket=bucket).get("Contents", []):
            admin.delete_object(Bucket=bucket, Key=obj["Key"])
        admin.delete_bucket(Bucket=bucket)
