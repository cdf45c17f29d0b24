"""gpuhpc.fsutil: the one data/cache directory rule and the one atomic writer."""
from __future__ import annotations

import os
import stat

import pytest

from gpuhpc import fsutil


def test_data_dir_override_and_platform_default(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path / "d"))
    assert fsutil.data_dir() == tmp_path / "d"
    monkeypatch.delenv("GPUHPC_DATA_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert fsutil.data_dir() == tmp_path / "xdg" / "gpuhpc"        # platformdirs on Linux


def test_ledger_and_jobs_use_the_same_data_dir(monkeypatch, tmp_path):
    from gpuhpc.jobs.render import default_checkpoint_dir
    from gpuhpc.jobs.spec import default_log_dir
    from gpuhpc.ledger.paths import default_db_path

    monkeypatch.delenv("GPUHPC_LOG_DIR", raising=False)
    monkeypatch.delenv("GPUHPC_CHECKPOINT_ROOT", raising=False)
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path))
    assert default_db_path() == tmp_path / "ledger.db"
    assert default_log_dir() == str(tmp_path / "logs")
    assert default_checkpoint_dir() == str(tmp_path / "checkpoints" / "%j")


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_CACHE_DIR", str(tmp_path))
    assert fsutil.cache_dir() == tmp_path
    monkeypatch.delenv("GPUHPC_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    assert fsutil.cache_dir() == tmp_path / "c" / "gpuhpc"


def test_write_atomic_text_bytes_mode(tmp_path):
    p = tmp_path / "sub" / "f.txt"
    fsutil.write_atomic(p, "hello\n")
    assert p.read_text() == "hello\n" and stat.S_IMODE(p.stat().st_mode) == 0o600     # private by default
    fsutil.write_atomic(p, b"\x00\x01", 0o644, fsync=True)
    assert p.read_bytes() == b"\x00\x01" and stat.S_IMODE(p.stat().st_mode) == 0o644
    assert os.listdir(p.parent) == ["f.txt"]


def test_write_atomic_replaces_a_planted_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("root's file")
    victim.chmod(0o600)
    p = tmp_path / "map"
    p.symlink_to(victim)
    fsutil.write_atomic(p, "new", 0o644)
    assert victim.read_text() == "root's file" and stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert not p.is_symlink() and p.read_text() == "new"


def test_atomic_path_refuses_a_temporary_file_swapped_for_a_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o600)
    with pytest.raises(OSError):
        with fsutil.atomic_path(tmp_path / "f", 0o666) as tmp:
            tmp.unlink()
            tmp.symlink_to(victim)
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600 and not (tmp_path / "f").exists()


def test_data_dir_is_created_private(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_DATA_DIR", str(tmp_path / "a" / "d"))
    d = fsutil.data_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_check_root_dir(tmp_path):
    ok = fsutil.check_root_dir(tmp_path / "locks", create=0o700)
    assert stat.S_IMODE(ok.stat().st_mode) == 0o700
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o1777)
    link = tmp_path / "link"
    link.symlink_to(ok)
    for bad in (open_dir, link):
        with pytest.raises(PermissionError, match="must be a directory owned by uid"):
            fsutil.check_root_dir(bad)
    with pytest.raises(FileNotFoundError):
        fsutil.check_root_dir(tmp_path / "absent", create=None)


def test_atomic_path_failure_keeps_the_old_file(tmp_path):
    p = tmp_path / "f"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with fsutil.atomic_path(p) as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["f"]
