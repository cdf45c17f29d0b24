"""Code snapshots (gpuhpc.jobs.snapshot) without a cluster: what goes in, the digest, the limit."""
from __future__ import annotations

import subprocess
import tarfile

import pytest

from gpuhpc.errors import UserInputError
from gpuhpc.jobs import snapshot
from gpuhpc.transport.local import LocalRunner


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@x", "PATH": "/usr/bin:/bin"})


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    (r / "pkg").mkdir(parents=True)
    (r / "train.py").write_text("print('v1')\n")
    (r / "pkg" / "m.py").write_text("X = 1\n")
    (r / ".gitignore").write_text("*.log\n")
    (r / "gone.py").write_text("")
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "commit", "-q", "-m", "x")
    return r


def test_tracked_changed_and_untracked_files_go_in_ignored_ones_do_not(repo, tmp_path):
    (repo / "train.py").write_text("print('v2')\n")           # uncommitted change
    (repo / "new.py").write_text("")                          # untracked, not ignored
    (repo / "run.log").write_text("x")                        # ignored by git
    (repo / "gone.py").unlink()                               # deleted in the work tree
    (repo / "data").mkdir()
    (repo / "data" / "big.bin").write_bytes(b"0" * 10)
    (repo / "pkg" / "w.ckpt").write_bytes(b"0")
    (repo / ".gpuhpcignore").write_text("# comment\ndata/\n*.ckpt\n/new.py\n")
    extra = tmp_path / "conf.yaml"
    extra.write_text("a: 1\n")
    snap = snapshot.collect(repo / "pkg", [str(extra)])
    names = [f[0] for f in snap.files]
    assert names == [".gitignore", "conf.yaml", "pkg/m.py", "train.py"]
    out = tmp_path / "s.tar.gz"
    snapshot.pack(snap, str(out))
    with tarfile.open(out) as tar:
        assert tar.extractfile("train.py").read() == b"print('v2')\n"
    # the digest is the content's: same files, same digest; one byte changed, another one
    assert snapshot.collect(repo, [str(extra)]).digest == snap.digest
    (repo / "pkg" / "m.py").write_text("X = 2\n")
    assert snapshot.collect(repo, [str(extra)]).digest != snap.digest


def test_too_big_names_the_largest_files(repo):
    (repo / "weights.bin").write_bytes(b"0" * (2 * 1024 * 1024))
    with pytest.raises(UserInputError) as err:
        snapshot.collect(repo, max_mb=1)
    line = err.value.one_line()
    assert "over the 1 MB limit" in line and "weights.bin (2.0 MB)" in line and ".gpuhpcignore" in line


def test_outside_a_repo_there_is_no_snapshot(tmp_path):
    assert snapshot.collect(tmp_path) is None


def test_upload_once_and_unpack_where_the_runner_runs(repo, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUHPC_REMOTE_DIR", str(tmp_path / "remote"))
    snap = snapshot.collect(repo)
    first = snapshot.upload(snap, LocalRunner())
    assert first.uploaded and (tmp_path / "remote" / "snapshots" / snap.digest / "train.py").read_text() == "print('v1')\n"
    again = snapshot.upload(snap, LocalRunner())
    assert not again.uploaded and again.path == first.path
    assert list((tmp_path / "remote" / "snapshots").iterdir()) == [tmp_path / "remote" / "snapshots" / snap.digest]
    assert snapshot.workdir_in(snap, first, str(repo / "pkg")) == f"{first.path}/pkg"


def test_ignore_patterns():
    pats = ["data/", "*.ckpt", "/top.txt", "sub/x.py"]
    assert snapshot.ignored("data/a", pats) and snapshot.ignored("a/data/b", pats)
    assert not snapshot.ignored("data", pats)                 # a file named data
    assert snapshot.ignored("a/b.ckpt", pats) and snapshot.ignored("top.txt", pats)
    assert not snapshot.ignored("a/top.txt", ["/top.txt"]) and snapshot.ignored("sub/x.py", pats)
