"""A node-local (NVMe) cache for S3 datasets: the first job on a node downloads, the others
wait on a lock and reuse it; a changed object (new ETag) is fetched again."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
from pathlib import Path

from gpuhpc.staging.s3 import S3Stager, S3Url


def default_cache_root() -> Path:
    return Path(os.environ.get("GPUHPC_CACHE_DIR")
                or os.path.join(os.environ.get("GPUHPC_SCRATCH_ROOT", "/tmp"), "gpuhpc-cache"))


class NodeCache:
    def __init__(self, stager: S3Stager, root: str | Path | None = None) -> None:
        self.stager = stager
        self.root = Path(root) if root else default_cache_root()

    def fetch(self, url: S3Url) -> tuple[Path, bool]:
        """Return (local path, downloaded?) for an S3 prefix or object."""
        self.root.mkdir(parents=True, exist_ok=True)
        slot = self.root / hashlib.sha256(str(url).encode()).hexdigest()[:24]
        manifest = {o.key: o.etag for o in self.stager.list(url)}
        with open(self.root / f"{slot.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            marker = slot / ".gpuhpc-complete"
            if marker.exists() and json.loads(marker.read_text()) == manifest:
                return slot / "data", False
            if slot.exists():
                shutil.rmtree(slot)
            self.stager.pull(url, slot / "data")
            marker.write_text(json.dumps(manifest, sort_keys=True))
            return slot / "data", True
