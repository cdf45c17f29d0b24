"""The node image cache (gpuhpc.containers.cache): one import per node, user and digest under a
lock, reuse, LRU eviction by size, the settings, and what job scripts and trials run."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import threading
from pathlib import Path

import pytest

from gpuhpc.containers import cache
from gpuhpc.containers.image import parse_ref
from gpuhpc.errors import UserInputError

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"127.0.0.1:5000#gpuhpc/test@{DIGEST}"


def _site(tmp_path, monkeypatch, body: str) -> Path:
    site = tmp_path / "site.toml"
    site.write_text(body)
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(site))
    return site


def _fake_import(calls: list):
    def importer(ref, dest: Path) -> None:
        calls.append(str(ref))
        dest.write_bytes(b"x" * 1000)
    return importer


def test_an_image_is_imported_once_then_reused(tmp_path):
    s = cache.CacheSettings(str(tmp_path / "c"))
    calls: list = []
    said: list = []
    path, new = cache.ensure(parse_ref(IMAGE), s, importer=_fake_import(calls), say=said.append)
    again, new2 = cache.ensure(parse_ref(IMAGE), s, importer=_fake_import(calls), say=said.append)
    assert (new, new2) == (True, False) and path == again and calls == [IMAGE]
    assert path == tmp_path / "c" / str(os.geteuid()) / ("ab" * 32 + ".sqsh")
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert "imported into the node cache" in said[0] and "reused from the node cache" in said[1]
    assert [r["event"] for r in cache.imports(path.parent)] == ["import"]


def test_jobs_starting_together_import_once(tmp_path):
    s = cache.CacheSettings(str(tmp_path / "c"))
    calls: list = []
    threads = [threading.Thread(target=cache.ensure, args=(parse_ref(IMAGE), s),
                                kwargs={"importer": _fake_import(calls), "say": lambda m: None}) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [IMAGE]


def test_least_recently_used_images_are_evicted_past_the_limit(tmp_path):
    s = cache.CacheSettings(str(tmp_path / "c"), limit_bytes=2500)
    refs = [parse_ref(f"r#a@sha256:{c * 64}") for c in "123"]
    paths = []
    for i, ref in enumerate(refs[:2]):
        p, _ = cache.ensure(ref, s, importer=_fake_import([]), say=lambda m: None)
        os.utime(p, (1000 + i, 1000 + i))
        paths.append(p)
    cache.ensure(refs[0], s, importer=_fake_import([]), say=lambda m: None)     # used again: the newest
    p3, _ = cache.ensure(refs[2], s, importer=_fake_import([]), say=lambda m: None)
    assert paths[0].exists() and p3.exists() and not paths[1].exists()
    events = [(r["event"], Path(r["file"]).name) for r in cache.imports(p3.parent)]
    assert ("evict", paths[1].name) in events


def test_a_failed_import_leaves_nothing(tmp_path):
    s = cache.CacheSettings(str(tmp_path / "c"))

    def broken(ref, dest):
        dest.write_bytes(b"half")
        raise cache.GpuhpcError("enroot import failed")
    with pytest.raises(cache.GpuhpcError):
        cache.ensure(parse_ref(IMAGE), s, importer=broken, say=lambda m: None)
    assert [p.name for p in cache.user_dir(s).iterdir()] == [".lock"]


def test_only_pinned_images_are_cached(tmp_path):
    with pytest.raises(UserInputError, match="not pinned"):
        cache.entry_name(parse_ref("nvcr.io#nvidia/pytorch:24.05-py3"))


def test_settings_from_the_site_config(tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, "")
    assert not cache.settings().enabled
    assert cache.shell_image_option(IMAGE) is None          # no cache: the job pulls as before
    _site(tmp_path, monkeypatch, '[containers]\nnode_cache_dir = "/scratch/img"\nnode_cache_limit_gb = 2\n')
    assert cache.settings() == cache.CacheSettings("/scratch/img", 2 * 1024**3)
    _site(tmp_path, monkeypatch, '[containers]\nnode_cache_dir = "scratch"\n')
    with pytest.raises(UserInputError, match="node_cache_dir"):
        cache.settings()
    _site(tmp_path, monkeypatch, '[containers]\nnode_cache_limit_gb = -1\n')
    with pytest.raises(UserInputError, match="node_cache_limit_gb"):
        cache.settings()


def test_the_job_script_word_asks_the_cache_and_falls_back_to_the_image(tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, '[containers]\nnode_cache_dir = "/scratch/img"\n')
    word = cache.shell_image_option(IMAGE)
    assert word is not None
    assert f"-m gpuhpc.containers.cache ensure {shlex.quote(IMAGE)}" in word
    # bash: one word; a cache that fails (here: no Python) leaves the image itself to pyxis
    out = subprocess.run(["bash", "-c", f'GPUHPC_PYTHON=false; printf "<%s>" {word}'], capture_output=True,
                         text=True, check=True).stdout
    assert out == f"<--container-image={IMAGE}>"
    assert cache.shell_image_option("nvcr.io#nvidia/pytorch:24.05-py3") is None     # a tag: pulled per job


def test_a_trial_step_runs_in_the_cached_image(tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, f'[containers]\nnode_cache_dir = "{tmp_path / "c"}"\n')
    monkeypatch.setattr(cache, "enroot_import", _fake_import([]))
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "4")
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    argv = cache.step_argv([f"--container-image={IMAGE}", "--container-mounts=/d:/d"], ["sh", "-c", "echo hi"])
    sqsh = tmp_path / "c" / str(os.geteuid()) / ("ab" * 32 + ".sqsh")
    assert argv == ["srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=0", "--cpus-per-task=4",
                    f"--container-image={sqsh}", "--container-mounts=/d:/d", "--container-name=gpuhpc-42",
                    "--", "sh", "-c", "echo hi"]


def test_prefetch_is_one_task_per_node():
    from gpuhpc.slurm import commands

    argv = commands.srun_per_node("n[1-3]", 3, ["python", "-m", "x"], partition="gpu")
    assert argv[:5] == ["srun", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=n[1-3]"]
    assert "--partition=gpu" in argv and argv[-4:] == ["--", "python", "-m", "x"]
    assert "--time=30" not in commands.srun_per_node("n1", 1, ["x"], within_job=True)


def test_imports_skips_torn_lines(tmp_path):
    (tmp_path / cache.LOG).write_text(json.dumps({"event": "import"}) + "\n{torn\n")
    assert cache.imports(tmp_path) == [{"event": "import"}]


def test_a_shared_cache_serves_root_owned_files_only(tmp_path, monkeypatch):
    s = cache.CacheSettings(str(tmp_path / "c"), shared=True)
    ref = parse_ref(IMAGE)
    assert cache.user_dir(s, uid=0) == tmp_path / "c" / "shared" and cache.user_dir(s, uid=1000).name == "1000"
    assert cache.shared_entry(s, ref) is None                   # nothing imported yet
    if os.geteuid() != 0:
        pytest.skip("needs root: only root can create the root-owned files a shared cache serves")
    path, new = cache.ensure(ref, s, importer=_fake_import([]), say=lambda m: None)
    assert new and path.parent.name == "shared"
    assert path.stat().st_mode & 0o777 == 0o644 and path.parent.stat().st_mode & 0o777 == 0o755
    assert cache.shared_entry(s, ref) == path
    path.parent.chmod(0o777)                                     # anyone could have planted it: not trusted
    assert cache.shared_entry(s, ref) is None
    assert cache.shared_entry(cache.CacheSettings(str(tmp_path / "c")), ref) is None   # not shared: never


def test_shared_is_a_site_setting(tmp_path, monkeypatch):
    _site(tmp_path, monkeypatch, '[containers]\nnode_cache_dir = "/scratch/img"\nnode_cache_shared = true\n')
    assert cache.settings().shared


def test_roots_imports_name_the_sites_login_so_enroot_uses_its_root_only_credentials(tmp_path, monkeypatch):
    """enroot 4.1.2 reads ENROOT_CONFIG_PATH/.credentials only for docker://USER@REGISTRY#…: root's
    import (gpuhpc image prefetch) names the site's login for the registry; nobody else's does."""
    creds = tmp_path / ".credentials"
    creds.write_text("machine nvcr.io login $oauthtoken password ngc-key\nmachine 127.0.0.1 login bot password x\n")
    monkeypatch.setattr(cache, "SITE_CREDENTIALS", str(creds))
    calls = []
    monkeypatch.setattr(cache.subprocess, "run",
                        lambda argv, **kw: calls.append(argv) or subprocess.CompletedProcess(argv, 0, ""))
    digest = "sha256:" + "ab" * 32
    monkeypatch.setattr(cache.os, "geteuid", lambda: 0)
    cache.enroot_import(parse_ref(f"nvcr.io#nvidia/pytorch@{digest}"), tmp_path / "a.sqsh")
    cache.enroot_import(parse_ref(f"127.0.0.1:5500#gpuhpc/test@{digest}"), tmp_path / "b.sqsh")
    cache.enroot_import(parse_ref(f"quay.io#x/y@{digest}"), tmp_path / "c.sqsh")
    monkeypatch.setattr(cache.os, "geteuid", lambda: 1000)
    cache.enroot_import(parse_ref(f"nvcr.io#nvidia/pytorch@{digest}"), tmp_path / "d.sqsh")
    assert [argv[-1] for argv in calls] == [f"docker://$oauthtoken@nvcr.io#nvidia/pytorch@{digest}",
                                            f"docker://bot@127.0.0.1:5500#gpuhpc/test@{digest}",
                                            f"docker://quay.io#x/y@{digest}", f"docker://nvcr.io#nvidia/pytorch@{digest}"]
