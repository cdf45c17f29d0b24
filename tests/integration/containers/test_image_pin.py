"""``gpuhpc image pin`` against the local registry (scripts/services/registry.sh: Debian's
docker-registry, an image pushed with skopeo): the digest is the one skopeo reports."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cli_helpers import gpuhpc

ROOT = Path(__file__).resolve().parents[3]
pytestmark = [pytest.mark.integration, pytest.mark.isolated]     # no shared cluster


def test_pin_resolves_the_tag_to_the_registry_digest():
    started = subprocess.run(["bash", str(ROOT / "scripts/services/registry.sh"), "start"], capture_output=True,
                             text=True, timeout=300)
    assert started.returncode == 0, started.stderr
    pinned = started.stdout.strip().splitlines()[-1]          # 127.0.0.1:PORT#gpuhpc/test@sha256:…
    host = pinned.split("#", 1)[0]
    res = gpuhpc("image", "pin", f"{host}#gpuhpc/test:1")
    assert res.returncode == 0, res.stderr
    assert res.stdout == pinned + "\n"
    res = gpuhpc("image", "pin", "--json", pinned)               # a digest alone: checked to exist
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["digest"] == pinned.split("@", 1)[1]
    res = gpuhpc("image", "pin", f"{host}#gpuhpc/test:no-such-tag")
    assert (res.returncode, res.stderr) == (1, f"error: {host} has no gpuhpc/test:no-such-tag\n")
    res = gpuhpc("image", "pin", f"{host}/gpuhpc/test:1")
    assert res.returncode == 2 and f"write {host}#gpuhpc/test:1" in res.stderr
