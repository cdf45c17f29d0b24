"""gpuhpc.jobs.checkpoint: atomic saves, latest checkpoint, restart count."""
from __future__ import annotations

import os

import pytest

from gpuhpc.jobs import checkpoint as ckpt


def test_save_atomic_file_dir_bytes_and_latest(tmp_path):
    dest = tmp_path / "ck"
    src = tmp_path / "scratch" / "step-1.bin"
    src.parent.mkdir()
    src.write_bytes(b"one")
    assert ckpt.save_atomic(src, directory=dest) == dest / "step-1.bin"
    assert (dest / "step-1.bin").read_bytes() == b"one" and os.readlink(dest / ".gpuhpc-latest") == "step-1.bin"
    d = tmp_path / "scratch" / "step-2"
    d.mkdir()
    (d / "w.pt").write_text("w2")
    ckpt.save_atomic(d, directory=dest)
    (d / "w.pt").write_text("w2b")
    ckpt.save_atomic(d, directory=dest)                   # replaces an existing directory
    assert (dest / "step-2" / "w.pt").read_text() == "w2b"
    ckpt.save_atomic(b"three", "step-3.bin", directory=dest)
    assert ckpt.latest_checkpoint(dest) == (dest / "step-3.bin").resolve()
    assert sorted(p.name for p in dest.iterdir()) == [".gpuhpc-latest", ".gpuhpc-saved", "step-1.bin", "step-2",
                                                      "step-3.bin"]


def test_save_atomic_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(FileNotFoundError):
        ckpt.save_atomic(tmp_path / "missing", directory=tmp_path / "ck")
    assert list((tmp_path / "ck").iterdir()) == []


@pytest.mark.parametrize("name", ["latest", "../x", ".hidden", ""])
def test_save_atomic_rejects_bad_names(tmp_path, name):
    with pytest.raises(ValueError):
        ckpt.save_atomic(b"x", name, directory=tmp_path)


def test_latest_without_link_is_newest_visible_entry(tmp_path):
    (tmp_path / "a").write_text("1")
    (tmp_path / ".tmp-b").write_text("partial")
    os.utime(tmp_path / "a", ns=(1, 1))
    (tmp_path / "c").write_text("3")
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "c"
    assert ckpt.latest_checkpoint(tmp_path / "nope") is None


def test_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUHPC_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.setenv("GPUHPC_RESTART_COUNT", "3")
    monkeypatch.setenv("GPUHPC_SCRATCH", str(tmp_path / "s"))
    monkeypatch.delenv("GPUHPC_LATEST_CHECKPOINT", raising=False)
    assert ckpt.checkpoint_dir() == tmp_path and ckpt.restart_count() == 3
    assert ckpt.scratch_dir().is_dir()
    ckpt.save_atomic(b"x", "s.bin")
    assert ckpt.latest_checkpoint() == (tmp_path / "s.bin").resolve()


def test_checkpointable_hook_default():
    class C(ckpt.Checkpointable):
        def __call__(self):
            return 1

    c = C()
    assert c.checkpoint() is None and c.restarts == 0
