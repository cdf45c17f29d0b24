"""The site's image trust policy at ``gpuhpc submit`` on the real cluster: a registry not on the
list and a tag on a partition that requires pins exit 2 with the reason and queue nothing; a
pinned image from an allowed registry is queued with pyxis' options on its srun line."""
from __future__ import annotations

import uuid

from cli_helpers import gpuhpc
from gpuhpc.slurm.client import SlurmClient

DIGEST = "sha256:" + "5e" * 32


def _queued(slurm: SlurmClient, name: str) -> list[str]:
    out = slurm.run(["squeue", "--noheader", "--all", f"--name={name}", "--format=%i"]).stdout
    return out.split()


def test_refused_images_queue_nothing_and_a_pinned_one_is_queued(tmp_path):
    site = tmp_path / "config.toml"
    site.write_text('[containers]\nallowed_registries = ["127.0.0.1:5000"]\n'
                    'require_digest_partitions = ["cpu"]\n')
    env = {"GPUHPC_SITE_CONFIG": str(site), "GPUHPC_DATA_DIR": str(tmp_path / "data"), "GPUHPC_LEDGER": "off",
           "GPUHPC_LOG_DIR": str(tmp_path / "logs")}
    slurm = SlurmClient()
    name = f"gpuhpc-test-image-{uuid.uuid4().hex[:8]}"
    base = ["submit", "--partition", "cpu", "--time", "5m", "--hold", "--name", name]

    res = gpuhpc(*base, "--image", "quay.io#gpuhpc/test:1", "--", "cat", "/etc/os-release", env=env)
    assert res.returncode == 2, res.stderr
    assert res.stderr == (f"error: image: registry quay.io is not allowed on this cluster (site config {site}) "
                          "(allowed: 127.0.0.1:5000)\n")
    res = gpuhpc(*base, "--image", "127.0.0.1:5000#gpuhpc/test:1", "--", "cat", "/etc/os-release", env=env)
    assert res.returncode == 2
    assert "partition cpu runs only images pinned by digest" in res.stderr
    assert "gpuhpc image pin 127.0.0.1:5000#gpuhpc/test:1" in res.stderr
    assert _queued(slurm, name) == []

    image = f"127.0.0.1:5000#gpuhpc/test@{DIGEST}"
    res = gpuhpc(*base, "--image", image, "--mount", f"{tmp_path}:/out", "--", "cat", "/etc/os-release", env=env)
    assert res.returncode == 0, res.stderr
    job_id = res.stdout.strip()
    try:
        assert _queued(slurm, name) == [job_id]
        script = slurm.run(["scontrol", "write", "batch_script", job_id, "-"]).stdout
        assert f"'--container-image={image}' --container-mounts={tmp_path}:/out" in script
    finally:
        slurm.run(["scancel", job_id], check=False)
