"""pyxis' importer (gpuhpc.containers.importer): the site's policy for a plain srun/sbatch
--container-image, the node cache for pinned images, a per-step file for the rest."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuhpc.containers import cache, importer
from gpuhpc.errors import GpuhpcError

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


def test_the_step_file_is_in_a_new_private_directory_no_planted_name_reaches(tmp_path, monkeypatch, capsys):
    """Issue 39 (hostile user): the step's file had a predictable name (gpuhpc-import-UID-JOB.STEP.sqsh)
    in a shared directory; another user could make it (or a symlink of it) first. Now each get makes
    a directory nobody could name before (mkdtemp, 0700) and enroot writes inside it."""
    calls: list = []
    _setup(tmp_path, monkeypatch, "", calls)
    old = tmp_path / f"gpuhpc-import-{os.geteuid()}-7.0.sqsh"
    old.symlink_to(tmp_path / "victim-file")                 # the old name, planted
    assert importer.main(["get", "docker://ubuntu:22.04"]) == 0
    assert importer.main(["get", "docker://ubuntu:22.04"]) == 0
    first, second = (Path(p) for p in capsys.readouterr().out.split())
    assert first.parent != second.parent and first.name == second.name == "image.sqsh"
    for p in (first, second):
        assert p.parent.parent == tmp_path and p.parent.name.startswith(f"gpuhpc-import-{os.geteuid()}-7.0.")
        assert stat.S_IMODE(os.lstat(p.parent).st_mode) == 0o700 and p.read_bytes() == b"sqsh"
    assert old.is_symlink() and not (tmp_path / "victim-file").exists()
    assert importer.main(["release"]) == 0
    assert not first.parent.exists() and not second.parent.exists() and old.is_symlink()


def test_release_removes_only_this_users_directories(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, "", calls)
    prefix = f"gpuhpc-import-{os.geteuid()}-7.0."
    foreign = tmp_path / f"{prefix}theirs"
    foreign.mkdir()
    (foreign / "keep").write_text("x")
    os.chown(foreign, 65534, 65534)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (target / "keep").write_text("x")
    (tmp_path / f"{prefix}link").symlink_to(target)
    assert importer.main(["get", "docker://ubuntu:22.04"]) == 0
    mine = Path(capsys.readouterr().out.strip()).parent
    assert importer.main(["release"]) == 0
    assert not mine.exists() and (foreign / "keep").exists() and (target / "keep").exists()


def test_a_shared_directory_without_the_sticky_bit_is_refused(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, "", calls)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setenv("ENROOT_TEMP_PATH", str(open_dir))
    assert importer.main(["get", "docker://ubuntu:22.04"]) == 1
    err = capsys.readouterr().err
    assert f"the import directory {open_dir} (uid 0, mode 0777) lets other users replace" in err, err
    assert calls == [] and list(open_dir.iterdir()) == []


def test_a_failed_import_leaves_no_directory(tmp_path, monkeypatch, capsys):
    calls: list = []
    _setup(tmp_path, monkeypatch, "", calls)

    def failing(ref, dest):
        dest.write_bytes(b"partial")
        raise GpuhpcError("enroot import of x failed (exit 1): 404")
    monkeypatch.setattr(importer, "enroot_import", failing)
    assert importer.main(["get", "docker://ubuntu:22.04"]) == 1
    assert "404" in capsys.readouterr().err
    assert not list(tmp_path.glob("gpuhpc-import-*"))
