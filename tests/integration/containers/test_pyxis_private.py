"""A job in an image on a real Slurm with pyxis and enroot (issue 23's first acceptance point, on a
private controller, pyxis_cluster.py on tests/private_slurm.py): the local registry's image (scripts/services/registry.sh)
pinned by digest; ``srun --container-image=…@sha256:…`` and ``gpuhpc submit --image …@sha256:…``
both print the image's /etc/os-release, and a file written to a mount is there; an NGC-style image
asks the nvidia-container-cli stand-in for exactly the job's GPUs. Marked isolated: nothing here
touches the shared local cluster."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from pyxis_cluster import NODES, ROOT, node_dir, python_image, pyxis_cluster, registry_image, shuffled_nvml, torch_style_image

from polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.isolated]


@pytest.fixture(scope="module")
def cluster():
    with pyxis_cluster() as c:
        yield c


@pytest.fixture
def user():
    """A throwaway Unix user (removed afterwards)."""
    name = f"gpuhpc-ctr-{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", name], check=True,
                   capture_output=True, timeout=60)
    try:
        yield name
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)


def test_a_job_runs_in_the_pinned_image(cluster, tmp_path):
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image()
    assert "@sha256:" in image

    res = subprocess.run(["srun", "--partition=pyx", "--time=5", f"--container-image={image}", "cat", "/etc/os-release"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"{res.stderr}\n{cluster.logs()}"
    assert "ID=gpuhpc-test" in res.stdout

    out = tmp_path / "out"
    out.mkdir()
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--partition", "pyx", "--time", "5m", "--name", "gpuhpc-test-pyxis",
                          "--json", "--image", image, "--mount", f"{out}:/out", "--",
                          "sh", "-c", "cat /etc/os-release; cat /etc/os-release > /out/os-release"],
                         env={**env, "GPUHPC_LEDGER": "off", "GPUHPC_DATA_DIR": str(tmp_path / "data")},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    wait_for(lambda: not client.run(["squeue", "-h", "-j", job["job_id"], "-o", "%i"], check=False).stdout.strip(),
             120, f"job {job['job_id']} to end\n{cluster.logs()}")
    assert Path(job["log"]).exists(), f"{job['log']} missing\n{cluster.logs()}"
    log = Path(job["log"]).read_text()
    assert 'PRETTY_NAME="gpuhpc test image 1 (busybox)"' in log, log
    assert (out / "os-release").read_text().startswith('NAME="gpuhpc test image"')


def test_an_ordinary_user_runs_as_itself_and_owns_what_it_writes_to_a_mount(cluster, user):
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image()
    pw = pwd.getpwnam(user)
    out = Path(tempfile.mkdtemp(prefix="gpuhpc-ctr-out-", dir="/var/tmp"))
    try:
        os.chown(out, pw.pw_uid, pw.pw_gid)
        res = subprocess.run(["runuser", "-u", user, "--", "env", f"SLURM_CONF={env['SLURM_CONF']}",
                              f"PATH={env['PATH']}", "srun", "--partition=pyx", "--time=5",
                              f"--container-image={image}", f"--container-mounts={out}:/out",
                              "sh", "-c", "id -u; touch /out/written"], capture_output=True, text=True, timeout=180,
                             cwd="/var/tmp")
        assert res.returncode == 0, f"{res.stderr}\n{cluster.logs()}"
        assert res.stdout.split()[0] == str(pw.pw_uid)               # the user's uid inside, not root
        assert (out / "written").stat().st_uid == pw.pw_uid
    finally:
        shutil.rmtree(out, ignore_errors=True)


def test_an_ngc_style_image_asks_nvidia_container_cli_for_exactly_the_jobs_gpus_by_uuid(cluster, tmp_path):
    """The image sets NVIDIA_VISIBLE_DEVICES=all; the job holds Slurm's GPUs 1 and 2 (a job on GPU 0
    first), the device files of minors 1 and 2. NVML enumerates the node's GPUs in another order
    (minors 2, 0, 3, 1: an HGX board's PCI bus order), so NVML's GPUs 1 and 2 are minors 0 and 3:
    enroot's 98-nvidia hook, after the role's 90-gpuhpc-slurm-gpus.sh, asks the stand-in on slurmd's
    PATH for the UUIDs of minors 1 and 2, not for indices (nor all, nor the first two)."""
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image("ngc")
    holder = client.run(["sbatch", "--parsable", "--partition=pyx", "--gpus=1", "--time=2", "--wrap", "sleep 120"],
                        check=False)
    assert holder.returncode == 0, holder.stderr
    holder_id = holder.stdout.strip().split(";")[0]
    try:
        wait_for(lambda: client.run(["squeue", "-h", "-j", holder_id, "-o", "%t"], check=False).stdout.strip() == "R",
                 60, "the job on GPU 0 to run")
        log = tmp_path / "nvidia-container-cli.log"
        res = subprocess.run(["srun", "--partition=pyx", "--time=5", "--gpus=2", f"--container-image={image}",
                              "sh", "-c", 'echo "step=$SLURM_STEP_GPUS inside=$NVIDIA_VISIBLE_DEVICES"'],
                             env={**env, "GPUHPC_NVCLI_LOG": str(log), **shuffled_nvml(tmp_path, [2, 0, 3, 1])},
                             capture_output=True, text=True, timeout=180)
    finally:
        client.run(["scancel", holder_id], check=False)
    assert res.returncode == 0, f"{res.stderr}\n{cluster.logs()}"
    assert "step=1,2 inside=GPU-minor-1,GPU-minor-2" in res.stdout, res.stdout
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and " configure " in f" {calls[0]} ", calls
    assert "--device=GPU-minor-1,GPU-minor-2" in calls[0].split() and "--compute" in calls[0].split(), calls


def test_an_ngc_style_image_is_refused_when_the_jobs_gpus_cannot_be_mapped(cluster, tmp_path):
    """NVML sees no GPU with the job's device minor (a node whose gres.conf names other devices):
    the container does not start, and the step's error names the GPU and the minors NVML has,
    rather than handing nvidia-container-cli a Slurm index that means another GPU."""
    image = registry_image("ngc")
    log = tmp_path / "nvidia-container-cli.log"
    res = subprocess.run(["srun", "--partition=pyx", "--time=5", "--gpus=1", f"--container-image={image}", "true"],
                         env={**cluster.env, "GPUHPC_NVCLI_LOG": str(log), **shuffled_nvml(tmp_path, [7, 8])},
                         capture_output=True, text=True, timeout=180)
    assert res.returncode != 0, res.stdout
    assert "cannot give the container the job's GPUs 0 by UUID" in res.stderr, res.stderr
    assert "is none of NVML's GPUs (minors [7, 8])" in res.stderr, res.stderr
    assert not log.exists() or not log.read_text().strip(), log.read_text()


def test_enroots_pytorch_hook_gives_each_node_of_a_step_its_rank_and_the_master(cluster):
    """Issue 39.6: with enroot's 50-slurm-pytorch hook enabled (as the role enables it), an image that
    sets PYTORCH_VERSION (as NGC's PyTorch images do) gets torch.distributed's variables from the
    step on each of two nodes: RANK, LOCAL_RANK, WORLD_SIZE, and MASTER_ADDR/PORT naming the first."""
    image = torch_style_image()
    res = subprocess.run(["srun", "--partition=pyx2", "--time=5", "--nodes=2", "--ntasks-per-node=1",
                          f"--container-image={image}", "sh", "-c",
                          'echo "rank $SLURMD_NODENAME $RANK $LOCAL_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $SLURM_JOB_ID"'],
                         env=cluster.env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, f"{res.stderr}\n{cluster.logs()}"
    rows = sorted(x.split()[1:] for x in res.stdout.splitlines() if x.startswith("rank "))
    job = rows[0][-1] if rows else "0"
    port = str(int(job) % 4536 + 61000)
    assert rows == [["pyx-node1", "0", "0", "2", "pyx-node1", port, job],
                    ["pyx-node2", "1", "0", "2", "pyx-node1", port, job]], res.stdout


def _cache_env(env: dict, base: Path, tmp_path: Path, sub: str = "") -> dict:
    """The environment of a user of a site whose node image cache is in the cluster's directory
    (``sub``: a fresh one under it, on every node: ``base/images`` is each node's own)."""
    images = base / "images" / sub
    for node in NODES:
        (node_dir(base, node, "images") / sub).mkdir(exist_ok=True)
    site = tmp_path / "site.toml"
    site.write_text(f'[containers]\nnode_cache_dir = "{images}"\n')
    return {**env, "GPUHPC_SITE_CONFIG": str(site), "GPUHPC_LEDGER": "off", "GPUHPC_DATA_DIR": str(tmp_path / "data")}


def _imports(base: Path) -> list[dict]:
    log = base / "images" / str(os.geteuid()) / "imports.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_sweep_of_20_trials_in_an_image_imports_it_once_per_node(cluster, tmp_path):
    """Issue 23: the trials run in the image (the trial runner stays on the host and starts each
    trial in an srun step there); the node cache shows one import and 19 trials' logs the reuse.
    (This private cluster has no accounting: the trials' end is read from the queue and logs.)"""
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image()
    e = _cache_env(env, base, tmp_path)
    before = [r for r in _imports(base) if r["image"] == image]
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"""name: ctr-sweep
command: echo "trial x={{x}} in $(grep ^ID= /etc/os-release)"
parameters:
  x: {{values: [{', '.join(str(i) for i in range(20))}]}}
method: grid
parallelism: 20
resources: {{partition: pyx, time: 5m, image: '{image}'}}
metric: {{name: loss, goal: minimize}}
""")
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "sweep", "run", "--json", str(sweep)], env=e,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    sid = json.loads(res.stdout)["sweep_id"]
    wait_for(lambda: not client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip(), 300,
             f"the sweep's 20 trials to end\n{cluster.logs()}")
    outs = [p.read_text() for p in (tmp_path / "data" / "sweeps" / str(sid) / "logs").glob("*.out")]
    ran = sorted(int(line.split()[1].split("=")[1]) for text in outs for line in text.splitlines()
                 if line.startswith("trial x=") and line.endswith("in ID=gpuhpc-test"))
    assert ran == list(range(20)), "\n".join(outs)
    imported = [r for r in _imports(base) if r["image"] == image and r["event"] == "import"]
    if not before:       # the first use on this node: one import, every other trial reused it
        assert len(imported) == 1, imported
        assert sum("imported into the node cache" in text for text in outs) == 1
    assert sum("reused from the node cache" in text for text in outs) == 20 - (0 if before else 1)
    listed = subprocess.run([sys.executable, "-m", "gpuhpc", "image", "cache", "--json"], env=e, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert any(im["file"] == imported[0]["file"] for im in json.loads(listed.stdout)["images"])


def test_prefetch_fills_a_nodes_cache_and_a_job_starts_from_it(cluster, tmp_path):
    """``gpuhpc image prefetch REF --nodes`` imports on the node; a job submitted with the
    image then reuses it (the job script asks the cache: gpuhpc.containers.cache)."""
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image("ngc")
    e = _cache_env(env, base, tmp_path)
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "image", "prefetch", image, "--nodes", "pyx-node1",
                          "--partition", "pyx"], env=e, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"{res.stderr}\n{cluster.logs()}"
    assert [r["event"] for r in _imports(base) if r["image"] == image] == ["import"]
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--partition", "pyx", "--time", "5m", "--json",
                          "--image", image, "--", "sh", "-c", "grep ^ID= /etc/os-release"], env=e,
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    wait_for(lambda: not client.run(["squeue", "-h", "-j", job["job_id"], "-o", "%i"], check=False).stdout.strip(),
             120, f"job {job['job_id']} to end\n{cluster.logs()}")
    log = Path(job["log"]).read_text()
    assert "reused from the node cache" in log and "ID=gpuhpc-test" in log, log
    assert [r["event"] for r in _imports(base) if r["image"] == image] == ["import"]


PROGRAM = r"""
i=0
if [ -n "$GPUHPC_LATEST_CHECKPOINT" ]; then i=$(cat "$GPUHPC_LATEST_CHECKPOINT/step"); fi
stop=0
trap 'stop=1' USR2
while [ "$i" -lt 40 ]; do
  i=$((i + 1))
  echo "step $i restart $GPUHPC_RESTART_COUNT" >> "$OUT/steps"
  sleep 0.15
  if [ "$stop" = 1 ]; then
    mkdir -p "$GPUHPC_CHECKPOINT_DIR/s$i" && echo "$i" > "$GPUHPC_CHECKPOINT_DIR/s$i/step"
    exit 0
  fi
done
"""


def test_a_job_in_an_image_is_requeued_at_the_signal_and_resumes_from_its_checkpoint(cluster, tmp_path):
    """Issue 23's checkpoint contract inside an image (one node: this private cluster has one):
    SIGUSR2 reaches the program in the image (srun forwards it), it saves its step to the
    checkpoint directory on a mount and exits; the job script requeues the job, and the restart
    finds GPUHPC_LATEST_CHECKPOINT inside and resumes: 40 steps, none lost or done twice."""
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image()
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    ckpt.mkdir()
    (out / "train.sh").write_text(PROGRAM)
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--partition", "pyx", "--time", "5m", "--json",
                          "--image", image, "--mount", f"{out}:{out}", "--mount", f"{ckpt}:{ckpt}",
                          "--checkpoint-dir", f"{ckpt}/%j", "--env", f"OUT={out}", "--", "sh", f"{out}/train.sh"],
                         env={**env, "GPUHPC_LEDGER": "off", "GPUHPC_DATA_DIR": str(tmp_path / "data")},
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)
    steps = out / "steps"
    wait_for(lambda: steps.exists() and len(steps.read_text().splitlines()) >= 5, 120,
             f"the program's first steps in the image\n{cluster.logs()}")
    client.run(["scancel", "--signal=USR2", "--batch", job["job_id"]], check=True)
    wait_for(lambda: not client.run(["squeue", "-h", "-j", job["job_id"], "-o", "%i"], check=False).stdout.strip(),
             180, f"job {job['job_id']} to be requeued and finish\n{cluster.logs()}")
    log = Path(job["log"]).read_text()
    rows = [line.split() for line in steps.read_text().splitlines()]
    assert [int(r[1]) for r in rows] == list(range(1, 41)), f"{rows}\n{log}"       # none lost, none twice
    assert {r[3] for r in rows} == {"0", "1"}, rows                                  # the second half after the requeue
    assert "requeueing job" in log, log


def test_a_step_on_two_nodes_runs_in_the_image_each_node_with_its_own_runtime_directories(cluster):
    """Two slurmd on one host: the second runs in a mount namespace of its own where its pyxis
    runtime_path, enroot directories and image cache are bound over the shared paths
    (pyxis_cluster.py). A 2-node step runs in the image on both, and a named container is made in
    each node's own enroot data directory (the same path in both namespaces)."""
    image = registry_image()
    res = subprocess.run(["srun", "--partition=pyx2", "--nodes=2", "--ntasks-per-node=1", "--time=5",
                          f"--container-image={image}", "--container-name=twonodes", "sh", "-c",
                          'echo "$SLURM_NODEID $SLURMD_NODENAME $(grep ^ID= /etc/os-release)"'], env=cluster.env,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, f"{res.stderr}\n{cluster.logs()}"
    assert sorted(res.stdout.splitlines()) == ["0 pyx-node1 ID=gpuhpc-test", "1 pyx-node2 ID=gpuhpc-test"], res.stdout
    uid = str(os.geteuid())
    for node in NODES:
        assert (node_dir(cluster.base, node, "enroot") / "data" / uid / "pyxis_twonodes").is_dir(), node
        assert (node_dir(cluster.base, node, "pyxis") / uid).is_dir(), node


EVERY, STEPS, WORLD = 10, 60, 4


def _runs(progress: Path) -> list[list[dict]]:
    """Per rank, per run of examples/train.py: {restart, resume, last, stop} from PROGRESS.<rank>."""
    out = []
    for rank in range(WORLD):
        path, per_run = Path(f"{progress}.{rank}"), []
        for line in (path.read_text().splitlines() if path.exists() else []):
            word, *rest = line.split()
            if word == "start":
                per_run.append({"restart": int(rest[0]), "resume": int(rest[1]), "last": int(rest[1]), "stop": None})
            elif word == "step" and per_run:
                per_run[-1]["last"] = int(rest[0])
            elif word == "stop" and per_run:
                per_run[-1]["stop"] = int(rest[0])
        out.append(per_run)
    return out


def test_a_two_node_torchrun_job_in_an_image_is_preempted_requeued_and_resumes_from_its_checkpoint(cluster, tmp_path):
    """Issue 23: the bare-metal chaos test's job (examples/train.py under the torchrun stand-in,
    tests/integration/jobs/fake_torchrun.py: 2 nodes x 2 ranks, a TCP all-reduce, one shard per
    rank) in an image with a Python (gpuhpc and the programs through a read-only mount of the
    tree). A job of a higher-priority partition preempts it: every rank stops after the same step,
    saves its shard to the checkpoint directory on a mount, the job is requeued and every rank
    resumes from that step (0 steps lost); the result equals an uninterrupted run's. The image
    comes from each node's image cache: imported once per node before the first run, reused by the
    second."""
    sys.path.insert(0, str(ROOT / "examples"))
    from train import reference

    client, env, base = cluster.client, cluster.env, cluster.base
    image = python_image()
    e = _cache_env(env, base, tmp_path, "torchrun")
    progress, result, ckpt = tmp_path / "progress", tmp_path / "result.json", tmp_path / "ckpt"
    ckpt.mkdir()
    res = subprocess.run([sys.executable, "-m", "gpuhpc", "submit", "--template", "torchrun", "--nodes", "2",
                          "--gpus", "2", "--partition", "pyx2", "--time", "5m", "--json", "--image", image,
                          "--mount", f"{ROOT}:{ROOT}:ro", "--mount", f"{tmp_path}:{tmp_path}",
                          "--checkpoint-dir", f"{ckpt}/%j", "--env", f"PYTHONPATH={ROOT}",
                          "--env", f"GPUHPC_TORCHRUN={ROOT}/tests/integration/jobs/fake_torchrun.py", "--",
                          "python3", "-u", f"{ROOT}/examples/train.py", "--steps", str(STEPS), "--ckpt-every",
                          str(EVERY), "--step-seconds", "0.2", "--backend", "tcp", "--progress", str(progress),
                          "--result", str(result), "--slow-runs", "1"],
                         env=e, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    job = json.loads(res.stdout)

    def log() -> str:
        return Path(job["log"]).read_text() if Path(job["log"]).exists() else ""

    wait_for(lambda: all(r and r[-1]["last"] >= EVERY + 2 for r in _runs(progress)), 120,
             f"every rank past step {EVERY + 2} in the image\n{log()}\n{cluster.logs()}")
    pre = client.run(["sbatch", "--parsable", "--partition=pyxhi", "--nodelist=pyx-node2", "--exclusive",
                      "--time=1", "--output=/dev/null", "--wrap", "true"], check=False)
    assert pre.returncode == 0, pre.stderr
    wait_for(lambda: not client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip(), 180,
             f"the job to be preempted, requeued and finish\n{log()}\n{cluster.logs()}")
    text = log()
    runs = _runs(progress)
    assert [len(r) for r in runs] == [2] * WORLD, f"{runs}\n{text}"
    stops = {r[0]["stop"] for r in runs}
    assert len(stops) == 1 and None not in stops, f"{runs}\n{text}"                   # all after one step
    assert {r[1]["resume"] for r in runs} == stops and all(r[0]["last"] == r[0]["stop"] for r in runs), runs
    assert all(r[1]["last"] == STEPS for r in runs), runs
    assert json.loads(result.read_text()) == reference(WORLD, STEPS)
    assert "requeueing job" in text, text
    for node in NODES:                     # each node imported the image once, the second run reused it
        rows = node_dir(base, node, "images") / "torchrun" / str(os.geteuid()) / "imports.jsonl"
        events = [json.loads(line)["event"] for line in rows.read_text().splitlines()
                  if json.loads(line)["image"] == image]
        assert events == ["import"], (node, events)
    assert text.count("imported into the node cache") == 2, text      # the first run's fill, one per node
    assert text.count("reused from the node cache") >= 3, text          # the batch step; both nodes at the restart


PYTHON_SWEEP = """
import json, sys
import gpuhpc

def trial(x):
    import os
    osid = [line.strip() for line in open("/etc/os-release") if line.startswith("ID=")][0]
    return {"loss": float(x * x), "where": f"{osid} python{sys.version_info[0]}.{sys.version_info[1]}",
            "node": os.environ.get("SLURMD_NODENAME")}

s = gpuhpc.sweep(trial, {"x": list(range(6))}, method="grid", metric="loss", parallelism=6, name="ctr-py",
                 resources={"partition": "pyx2", "time": "5m", "image": sys.argv[1], "image_python": True,
                            "mounts": [sys.argv[2] + ":" + sys.argv[2] + ":ro"]})
print(json.dumps({"sweep_id": s.id}))
"""


def test_a_python_sweep_runs_its_trials_in_an_image_imported_once_per_node(cluster, tmp_path):
    """Issue 23: ``gpuhpc.sweep(fn, resources={image, image_python: True})``: each trial's runner
    (gpuhpc on the host) starts the same module with the image's python3 in an srun step, with the
    sweep directory mounted: the function runs there and its results and metrics land in the
    sweep directory. Each node that ran trials imported the image into its cache once."""
    import cloudpickle

    client, env, base = cluster.client, cluster.env, cluster.base
    image = python_image()
    e = {**_cache_env(env, base, tmp_path, "pysweep"), "PYTHONPATH": str(ROOT)}    # gpuhpc in the image: the mounted tree
    script = tmp_path / "sweep.py"
    script.write_text(PYTHON_SWEEP)
    res = subprocess.run([sys.executable, str(script), image, str(ROOT)], env=e, capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    sid = json.loads(res.stdout.splitlines()[-1])["sweep_id"]
    wait_for(lambda: not client.run(["squeue", "-h", "-o", "%i"], check=False).stdout.strip(), 180,
             f"the sweep's 6 trials to end\n{cluster.logs()}")
    sweep_dir = tmp_path / "data" / "sweeps" / str(sid)
    logs = "\n".join(p.read_text() for p in (sweep_dir / "logs").glob("*.out"))
    results = {}
    for n in range(6):
        path = sweep_dir / "trials" / str(n) / "result.pkl"
        assert path.exists(), f"trial {n} has no result\n{logs}"
        results[n] = cloudpickle.loads(path.read_bytes())
        metrics = [json.loads(line)["metrics"] for line in (path.parent / "metrics.jsonl").read_text().splitlines()]
        assert metrics == [{"loss": float(n * n)}], (n, metrics)
    assert {r["where"] for r in results.values()} == {"ID=gpuhpc-python python3.11"}, results
    assert [r["loss"] for r in results.values()] == [float(n * n) for n in range(6)]
    nodes = {r["node"] for r in results.values()}
    for node in NODES:
        rows = node_dir(base, node, "images") / "pysweep" / str(os.geteuid()) / "imports.jsonl"
        events = [json.loads(line)["event"] for line in (rows.read_text().splitlines() if rows.exists() else [])
                  if json.loads(line)["image"] == image]
        assert events == (["import"] if node in nodes else []), (node, nodes, events)
    assert logs.count("imported into the node cache") == len(nodes), logs
    assert logs.count("reused from the node cache") == 6 - len(nodes), logs


@pytest.fixture
def importer(cluster, tmp_path):
    """pyxis with gpuhpc's importer (importer= in plugstack.conf; slurmstepd reads it per step),
    put back afterwards."""
    plugstack = cluster.base / "plugstack.conf"
    before = plugstack.read_text()
    script = cluster.base / "gpuhpc-importer"
    script.write_text(f'#!/bin/sh\nexec {sys.executable} -I -m gpuhpc.containers.importer "$@"\n')
    script.chmod(0o755)
    plugstack.write_text(before.rstrip("\n") + f" importer={script}\n")
    try:
        yield
    finally:
        plugstack.write_text(before)


def test_plain_srun_is_held_to_the_site_policy_by_the_importer(cluster, importer, tmp_path):
    """Issue 23: a plain ``srun --container-image`` (no gpuhpc client) meets the site's policy in
    pyxis' importer: a registry not on the list and a tag where pins are required are refused
    before any container exists; the pinned image from an allowed registry runs."""
    client, env, base = cluster.client, cluster.env, cluster.base
    image = registry_image()
    tag = image.split("@")[0] + ":1"
    site = tmp_path / "site.toml"

    def srun(ref: str, policy: str) -> subprocess.CompletedProcess:
        site.write_text(f"[containers]\n{policy}\n")
        return subprocess.run(["srun", "--partition=pyx", "--time=5", f"--container-image={ref}", "grep", "^ID=",
                               "/etc/os-release"], env={**env, "GPUHPC_SITE_CONFIG": str(site)},
                              capture_output=True, text=True, timeout=180)

    registry = image.split("#")[0]                           # 127.0.0.1:PORT
    refused = srun(image, 'allowed_registries = ["nvcr.io"]')
    assert refused.returncode != 0 and f"registry {registry} is not allowed" in refused.stderr, refused.stderr
    pins = f'allowed_registries = ["{registry}"]\nrequire_digest_partitions = ["pyx"]'
    refused = srun(tag, pins)
    assert refused.returncode != 0 and "runs only images pinned by digest" in refused.stderr, refused.stderr
    ran = srun(image, pins)
    assert ran.returncode == 0 and ran.stdout.strip() == "ID=gpuhpc-test", f"{ran.stderr}\n{cluster.logs()}"
