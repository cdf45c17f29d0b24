"""pyxis' importer (gpuhpc.containers.importer): the site's policy for a plain srun/sbatch
--container-image, the node cache for pinned images, a per-step file for the rest."""
from __future__ import annotations

import os

from gpuhpc.containers import cache, importer

DIGEST = "sha256:" + "cd" * 32
PINNED = f"docker://127.0.0.1:5000#gpuhpc/test@{DIGEST}"


def _setup(tmp_path, monkeypatch, policy: str, calls: list) -> None:
    site = tmp_path / "site.toml"
    site.write_text(f"[containers]\n{policy}\n")
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(site))
    monkeypatch.setenv("ENROOT_TEMP_PATH", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "gpu")

    def fake(ref, dest):
        calls.append(str(ref))
        dest.write_bytes(b"sqsh")
    monkeypatch.setattr(importer, "enroot_import", fake)
    monkeypatch.setattr(cache, "enroot_import", fake)


def test_a_registry_not_allowed_is_refused_with_the_reason(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, 'allowed_registries = ["nvcr.io"]', calls)
    assert importer.main(["get", PINNED]) == 1
    assert "registry 127.0.0.1:5000 is not allowed" in capsys.readouterr().err and calls == []


def test_a_tag_on_a_partition_that_requires_pins_is_refused(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, 'require_digest_partitions = ["gpu"]', calls)
    assert importer.main(["get", "docker://nvcr.io#nvidia/pytorch:24.05-py3"]) == 1
    err = capsys.readouterr().err
    assert "runs only images pinned by digest" in err and "gpuhpc image pin" in err and calls == []


def test_an_allowed_image_is_imported_for_the_step_and_released(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, "", calls)
    assert importer.main(["get", "docker://ubuntu:22.04"]) == 0
    path = capsys.readouterr().out.strip()
    assert os.path.exists(path) and path.startswith(str(tmp_path)) and calls == ["ubuntu:22.04"]
    assert importer.main(["release"]) == 0 and importer.main(["release"]) == 0     # pyxis may call it twice
    assert not os.path.exists(path)


def test_a_pinned_image_comes_from_the_node_cache(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, f'node_cache_dir = "{tmp_path / "c"}"', calls)
    for _ in range(2):
        assert importer.main(["get", PINNED]) == 0
    paths = capsys.readouterr().out.split()
    assert paths[0] == paths[1] == str(tmp_path / "c" / str(os.geteuid()) / ("cd" * 32 + ".sqsh"))
    assert len(calls) == 1
    importer.main(["release"])
    assert os.path.exists(paths[0])                       # the cache's file stays


def test_bad_usage_exits_2():
    assert importer.main([]) == 2 and importer.main(["get"]) == 2
