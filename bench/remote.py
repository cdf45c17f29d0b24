"""The laptop path, each figure a ratio to a baseline measured in the same run:

1. ``gpuhpc --cluster lab submit`` (code snapshot already on the cluster) vs ``ssh host sbatch``
   of the same script (OpenSSH client, script on stdin) through the same sshd. Goal <= 1.5x.
2. Cache-hit start-up of a 200 MB input (NodeCache.fetch: one LIST + the stat check, then
   reading the data) vs reading the same data from local disk. Goal <= 1.2x.
3. S3 staging throughput (S3Stager.pull) vs boto3's ``download_file`` with default settings,
   for one 200 MB object and for 200 x 1 MB objects. Goal >= 1.0x.

Needs the sshd (scripts/services/sshd.sh) and SeaweedFS (scripts/services/s3.sh) that the
tests use; both are started if they are not running. Jobs are submitted held to the ``cpu``
partition and cancelled. Run: ``.venv/bin/python bench/remote.py [--mb 200] [--runs 5]``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def service(name: str) -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / f"scripts/services/{name}.sh"), "start"], check=True,
                         capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return dict(kv.split("=", 1) for kv in out.split())


CPU: dict[str, float] = {}     # this process's CPU seconds (all threads), median, of the last pair()


def pair(ours, base, runs: int) -> tuple[float, float]:
    """Medians of ``ours`` and ``base``, run alternately (the machine is shared: noise hits both)."""
    o, b, oc, bc = [], [], [], []
    for i in range(runs):
        for fn, out, cpu in ((ours, o, oc), (base, b, bc)) if i % 2 else ((base, b, bc), (ours, o, oc)):
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            out.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    CPU.update(ours=statistics.median(oc), base=statistics.median(bc))
    return statistics.median(o), statistics.median(b)


def line(what: str, ours: float, base: float, goal: str, unit: str = "s") -> None:
    ratio = ours / base if base else float("nan")
    print(f"{what:58} gpuhpc {ours:8.3f}{unit}  baseline {base:8.3f}{unit}  ratio {ratio:5.2f}x  (goal {goal})")


def bench_submit(runs: int, tmp: Path) -> None:
    ssh = service("sshd")
    user, hostport = ssh["GPUHPC_TEST_SSH_HOST"].split("@")
    host, port = hostport.split(":")
    cfg = tmp / "config.toml"
    slurm_conf = os.environ.get("SLURM_CONF")
    cfg.write_text(f'[clusters.lab]\nhost = "{host}"\nuser = "{user}"\nport = {port}\n'
                   f'key = "{ssh["GPUHPC_TEST_SSH_KEY"]}"\nknown_hosts = "{ssh["GPUHPC_TEST_SSH_KNOWN_HOSTS"]}"\n'
                   f'remote_dir = "{tmp / "remote"}"\n' + (f'slurm_conf = "{slurm_conf}"\n' if slurm_conf else ""))
    repo = tmp / "proj"
    repo.mkdir()
    (repo / "train.py").write_text("print('hi')\n")
    genv = {"GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@x", "GIT_COMMITTER_NAME": "b",
            "GIT_COMMITTER_EMAIL": "b@x", "PATH": os.environ["PATH"]}
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "x"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=genv)
    env = {**os.environ, "GPUHPC_CONFIG": str(cfg), "GPUHPC_SITE_CONFIG": str(tmp / "site.toml"),
           "GPUHPC_SSH_CONFIG": str(tmp / "ssh_config"), "GPUHPC_LEDGER": "off", "GPUHPC_CMDSERVER": "off",
           "GPUHPC_DATA_DIR": str(tmp / "data")}
    for k in ("GPUHPC_SSH_HOST", "GPUHPC_CLUSTER"):
        env.pop(k, None)
    ids: list[str] = []
    log_dir = tmp / "remote" / "logs"

    def ours() -> None:
        res = subprocess.run([sys.executable, "-m", "gpuhpc", "--cluster", "lab", "submit", "--partition", "cpu",
                              "--time", "5", "--hold", "--name", "bench-remote", "--log-dir", str(log_dir),
                              "--", "python3", "train.py"], cwd=repo, env=env, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        ids.append(res.stdout.strip())

    # the same script, as gpuhpc rendered it, through OpenSSH's client and sbatch
    dry = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--partition", "cpu", "--time", "5", "--hold",
                          "--name", "bench-remote", "--log-dir", str(log_dir), "--dry-run", "--", "python3", "train.py"],
                         cwd=repo, env=env, capture_output=True, text=True, check=True).stdout
    remote_sbatch = (f"env SLURM_CONF={slurm_conf} " if slurm_conf else "") + "sbatch --parsable"
    base_argv = ["ssh", "-p", port, "-i", ssh["GPUHPC_TEST_SSH_KEY"], "-o", f"UserKnownHostsFile={ssh['GPUHPC_TEST_SSH_KNOWN_HOSTS']}",
                 "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"{user}@{host}", remote_sbatch]

    def baseline() -> None:
        res = subprocess.run(base_argv, input=dry, capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
        ids.append(res.stdout.strip().split(";")[0])

    try:
        ours()                                  # uploads the snapshot once: not timed
        o, b = pair(ours, baseline, runs)
        line("submit over SSH (snapshot unchanged) vs ssh host sbatch", o, b, "<= 1.5x")
    finally:
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True)


def bench_staging(mb: int, runs: int, tmp: Path) -> None:
    os.environ.update(service("s3"))
    import boto3
    from boto3.s3.transfer import TransferConfig

    from gpuhpc.staging.cache import NodeCache
    from gpuhpc.staging.s3 import MB, S3Stager, S3Url

    stager = S3Stager.from_env()
    bucket = f"gpuhpc-bench-{uuid.uuid4().hex[:8]}"
    stager.ensure_bucket(bucket)
    big = tmp / "big" / "data.bin"
    big.parent.mkdir()
    with open(big, "wb") as fh:
        for _ in range(mb):
            fh.write(os.urandom(MB))
    stager.push(big.parent, S3Url.parse(f"s3://{bucket}/big/"))
    small = tmp / "small"
    small.mkdir()
    for i in range(200):
        (small / f"part-{i:03d}.bin").write_bytes(os.urandom(MB))
    stager.push(small, S3Url.parse(f"s3://{bucket}/small/"))

    # 2. cache hit vs reading from local disk (both from the page cache after the first read)
    cache = NodeCache(stager, tmp / "cache")
    url = S3Url.parse(f"s3://{bucket}/big/")
    cache.fetch(url)

    def read(path: Path) -> None:
        with open(path, "rb", buffering=0) as fh:
            while fh.read(8 * MB):
                pass

    def hit() -> None:
        path, fetched = cache.fetch(url)
        assert not fetched
        read(path / "data.bin")

    read(big)
    o, b = pair(hit, lambda: read(big), runs)
    line(f"cache-hit start-up, {mb} MB input (fetch + read) vs local read", o, b, "<= 1.2x")

    # 3. throughput vs boto3 download_file with its defaults
    client = boto3.client("s3", endpoint_url=os.environ["GPUHPC_S3_ENDPOINT_URL"], region_name="us-east-1",
                          config=__import__("botocore.config").config.Config(s3={"addressing_style": "path"}))
    default = TransferConfig()

    def boto_big() -> None:
        client.download_file(bucket, "big/data.bin", str(tmp / "b.bin"), Config=default)

    def ours_big() -> None:
        stager.pull(S3Url.parse(f"s3://{bucket}/big/data.bin"), tmp / "o.bin")

    def boto_small() -> None:
        out = tmp / "bs"
        out.mkdir(exist_ok=True)
        for i in range(200):
            client.download_file(bucket, f"small/part-{i:03d}.bin", str(out / f"{i}"), Config=default)

    def ours_small() -> None:
        stager.pull(S3Url.parse(f"s3://{bucket}/small/"), tmp / "os")

    for what, size, o_fn, b_fn in ((f"1 x {mb} MB", mb, ours_big, boto_big), ("200 x 1 MB", 200, ours_small, boto_small)):
        o, b = pair(o_fn, b_fn, runs)
        print(f"{'S3 pull throughput, ' + what:58} gpuhpc {size / o:8.1f}MB/s  baseline {size / b:8.1f}MB/s  "
              f"ratio {b / o:5.2f}x  (goal >= 1.0x; CPU s here {CPU['ours']:.2f} vs {CPU['base']:.2f})")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--only", choices=("submit", "staging"))
    ns = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gpuhpc-bench-remote-"))
    try:
        if ns.only in (None, "submit"):
            bench_submit(ns.runs, tmp)
        if ns.only in (None, "staging"):
            bench_staging(ns.mb, ns.runs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
