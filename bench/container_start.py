"""Container start-up with pyxis and enroot against a bare ``srun true``, in one run (issue 23):

- bare:   ``srun true`` in an allocation (median of --repeat);
- cold:   the first ``srun --container-image=IMG --container-name=N true`` (enroot imports the
          image: layers from the registry, squashfs, unpack), with the squash options used;
- cached: the same again (the named container is reused: what every later step of a gpuhpc job
          gets, as the templates name each job's container), median of --repeat;
- node cache: ``srun --container-image=/…/DIGEST.sqsh true`` from the node image cache
          (gpuhpc.containers.cache: what a new job of the same user on the node gets; the
          container is unpacked from the squashfs file each time), median of --repeat.

Goal: a cached start at most 1 s above bare. It runs on the first node of a private controller whose
plugstack loads pyxis (tests/integration/containers/pyxis_cluster.py: enroot and pyxis built by
scripts/build-containers.sh from $GPUHPC_VENDOR_DIR, the local registry's image), never on the
shared cluster. Usage: GPUHPC_VENDOR_DIR=… python bench/container_start.py [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "integration" / "containers")]

from pyxis_cluster import SQUASH_OPTIONS, pyxis_cluster, registry_image  # noqa: E402

SCRIPT = r"""
t() { local a b; a=$(date +%s.%N); "$@" >/dev/null || exit 1; b=$(date +%s.%N); echo "$a $b" | awk '{printf "%.3f\n", $2 - $1}'; }
for i in $(seq "$1"); do echo "bare $(t srun true)"; done
echo "cold $(t srun --container-image="$2" --container-name=bench true)"
for i in $(seq "$1"); do echo "cached $(t srun --container-image="$2" --container-name=bench true)"; done
for i in $(seq "$1"); do echo "nodecache $(t srun --container-image="$3" true)"; done
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    image = registry_image()
    from gpuhpc.containers.cache import CacheSettings, ensure
    from gpuhpc.containers.image import parse_ref

    with pyxis_cluster() as cluster:
        env = cluster.env
        os.environ["PATH"] = env["PATH"]            # enroot import (the node cache's) from the cluster's prefix
        sqsh, _ = ensure(parse_ref(image), CacheSettings(str(cluster.base / "images")), say=lambda m: None)
        res = subprocess.run(["salloc", "--partition=pyx", "--time=10", "bash", "-c", SCRIPT, "bench",
                              str(args.repeat), image, str(sqsh)], env=env, capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            print(res.stdout, res.stderr, cluster.logs(), sep="\n", file=sys.stderr)
            return 1
    times: dict[str, list[float]] = {}
    for line in res.stdout.splitlines():
        kind, _, value = line.partition(" ")
        times.setdefault(kind, []).append(float(value))
    bare, cold, cached = statistics.median(times["bare"]), times["cold"][0], statistics.median(times["cached"])
    node = statistics.median(times["nodecache"])
    print(f"image {image}")
    print(f"bare srun true:          {bare:6.2f} s (median of {len(times['bare'])})")
    print(f"cold container start:    {cold:6.2f} s ({cold / bare:.1f}x bare; ENROOT_SQUASH_OPTIONS={SQUASH_OPTIONS!r})")
    print(f"cached container start:  {cached:6.2f} s ({cached / bare:.1f}x bare, {cached - bare:+.2f} s; goal <= +1 s: "
          f"{'met' if cached - bare <= 1.0 else 'NOT met'})")
    print(f"node-cache start:        {node:6.2f} s ({node / bare:.1f}x bare, {node - bare:+.2f} s; a new job, image "
          f"already in the node cache)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
