"""The node-local cache is per user and refuses what another user could control: a planted
symlink, a directory owned by someone else, a directory others can write. (The download path
against the real S3 server is tests/integration/staging/test_s3.py.)"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuhpc.errors import StagingError
from gpuhpc.staging.cache import NodeCache, UnsafeCacheError, check_private_dir, default_cache_root

NOBODY = 65534


@dataclass
class _Obj:
    key: str
    etag: str


class FakeStager:
    """list() and pull() of one object, counting downloads."""

    def __init__(self, etag: str = "e1") -> None:
        self.etag, self.pulls = etag, 0

    def list(self, url):
        return [_Obj("data/a.txt", self.etag)]

    def pull(self, url, local) -> int:
        self.pulls += 1
        Path(local).mkdir(parents=True, exist_ok=True)
        (Path(local) / "a.txt").write_text(self.etag)
        return 1


URL = "s3://bucket/data/"


def _as_root() -> bool:
    return os.geteuid() == 0


def test_default_root_is_per_user(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUHPC_NODE_CACHE_ROOT", raising=False)
    monkeypatch.setenv("GPUHPC_SCRATCH_ROOT", str(tmp_path))
    assert default_cache_root() == tmp_path / f"gpuhpc-cache-{os.geteuid()}"
    monkeypatch.setenv("GPUHPC_NODE_CACHE_ROOT", "/local/gpuhpc-cache")
    assert default_cache_root() == Path("/local/gpuhpc-cache") / str(os.geteuid())


def test_created_0700_whatever_the_umask_and_reused(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUHPC_NODE_CACHE_ROOT", raising=False)
    monkeypatch.setenv("GPUHPC_SCRATCH_ROOT", str(tmp_path))
    old = os.umask(0)
    try:
        stager = FakeStager()
        path, fetched = NodeCache(stager).fetch(URL)
    finally:
        os.umask(old)
    root = default_cache_root()
    assert fetched and (path / "a.txt").read_text() == "e1"
    assert oct(root.stat().st_mode & 0o777) == oct(0o700)
    assert NodeCache(stager).fetch(URL) == (path, False) and stager.pulls == 1
    stager.etag = "e2"
    assert NodeCache(stager).fetch(URL) == (path, True) and (path / "a.txt").read_text() == "e2"


def test_planted_symlink_is_refused(monkeypatch, tmp_path):
    monkeypatch.delenv("GPUHPC_NODE_CACHE_ROOT", raising=False)
    monkeypatch.setenv("GPUHPC_SCRATCH_ROOT", str(tmp_path))
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir(mode=0o700)
    default_cache_root().symlink_to(elsewhere)
    with pytest.raises(UnsafeCacheError) as err:
        NodeCache(FakeStager()).fetch(URL)
    msg = err.value.one_line()
    assert str(default_cache_root()) in msg and "symlink" in msg and "rm " in msg
    assert list(elsewhere.iterdir()) == []


def test_planted_symlink_inside_is_not_followed(tmp_path):
    """Inside the user's 0700 directory nobody else can plant one, but a file is still opened
    with O_NOFOLLOW: the lock file and the completion marker."""
    root = tmp_path / "cache"
    stager = FakeStager()
    NodeCache(stager, root).fetch(URL)
    target = tmp_path / "victim"
    target.write_text("keep")
    lock = next(root.glob("*.lock"))
    lock.unlink()
    lock.symlink_to(target)
    with pytest.raises(UnsafeCacheError, match="symlink"):
        NodeCache(stager, root).fetch(URL)
    assert target.read_text() == "keep"


def test_directory_of_another_user_is_refused(tmp_path):
    victim = tmp_path / "cache"
    victim.mkdir(mode=0o700)
    if _as_root():
        os.chown(victim, NOBODY, NOBODY)
        with pytest.raises(UnsafeCacheError) as err:
            NodeCache(FakeStager(), victim).fetch(URL)
        assert f"owned by uid {NOBODY}" in err.value.one_line() and str(victim) in err.value.one_line()
    # as any user: a directory checked against a uid that is not its owner's
    with pytest.raises(UnsafeCacheError, match="owned by uid"):
        check_private_dir(victim, uid=os.lstat(victim).st_uid + 1)


def test_directory_others_can_write_is_refused(tmp_path):
    lax = tmp_path / "cache"
    lax.mkdir()
    os.chmod(lax, 0o777)
    with pytest.raises(UnsafeCacheError) as err:
        NodeCache(FakeStager(), lax).fetch(URL)
    assert "0777" in err.value.one_line() and "chmod 700" in err.value.one_line()


def test_shared_root_gets_a_private_subdirectory(monkeypatch, tmp_path):
    shared = tmp_path / "site-cache"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("GPUHPC_NODE_CACHE_ROOT", str(shared))
    path, fetched = NodeCache(FakeStager()).fetch(URL)
    mine = shared / str(os.geteuid())
    assert fetched and path.is_relative_to(mine)
    assert mine.stat().st_mode & 0o777 == 0o700
    os.chmod(shared, 0o777)                   # world-writable without the sticky bit
    with pytest.raises(UnsafeCacheError, match="lets other users replace"):
        NodeCache(FakeStager()).fetch(URL)


def test_unsafe_cache_is_a_staging_error_exit_1():
    assert issubclass(UnsafeCacheError, StagingError) and UnsafeCacheError.exit_code == 1
