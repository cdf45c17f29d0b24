"""``gpuhpc image``: container images (docs/containers.md)."""
from __future__ import annotations

import sys

import click

from gpuhpc.cli.main import help_for


@click.group("image", help=help_for("image"))
def image() -> None:
    pass


@image.command("pin", help="Resolve REF's tag to the digest its registry reports and print the pinned "
                           "reference (REGISTRY#REPO@sha256:…), for --image on a partition that requires pins.")
@click.argument("ref")
@click.option("--timeout", type=float, default=30.0, show_default=True, metavar="S", help="per request")
@click.option("--json", "json_out", is_flag=True, help="print {image, registry, repo, tag, digest} as JSON")
def pin(ref: str, timeout: float, json_out: bool) -> int:
    from gpuhpc.containers.image import parse_ref
    from gpuhpc.containers.registry import resolve_digest

    parsed = parse_ref(ref, "REF")
    digest = resolve_digest(parsed, timeout=timeout)
    pinned = parsed.with_digest(digest)
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json({"image": str(pinned), "registry": parsed.registry, "repo": parsed.repo,
                    "tag": parsed.tag, "digest": digest})
    else:
        sys.stdout.write(f"{pinned}\n")
    return 0


@image.command("prefetch", help="Import REF (pinned by digest) into the node image cache of every node in --nodes "
                                "(one task per node), so that jobs there start from it.")
@click.argument("ref")
@click.option("--nodes", required=True, metavar="HOSTLIST", help="e.g. gpu-node[1-4]")
@click.option("--partition", "-p", default=None, help="the partition to run the prefetch step in")
def prefetch(ref: str, nodes: str, partition: str | None) -> int:
    from gpuhpc.containers.cache import prefetch as run_prefetch
    from gpuhpc.containers.cache import settings
    from gpuhpc.containers.image import check_image
    from gpuhpc.errors import UserInputError
    from gpuhpc.hostlist import expand

    if not check_image(ref, partition, field="REF").pinned:
        raise UserInputError(f"{ref} is a tag: only images pinned by digest are cached", field="REF",
                             hint=f"pin it: gpuhpc image pin {ref}")
    if not settings().enabled:
        raise UserInputError("this site has no node image cache", field="containers.node_cache_dir",
                             hint="set node_cache_dir in [containers] of the site config (docs/containers.md)")
    if not expand(nodes, field="--nodes") or any(c in nodes for c in "\n\r\0"):
        raise UserInputError("no node given", field="--nodes", hint="e.g. gpu-node[1-4]")
    sys.stderr.write(run_prefetch(ref, nodes, partition=partition))
    return 0


@image.command("cache", help="This user's node image cache on this node: the cached images (least recently "
                             "used first) and the imports and evictions recorded.")
@click.option("--json", "json_out", is_flag=True, help="print {dir, images, imports} as JSON")
def cache(json_out: bool) -> int:
    from gpuhpc.containers.cache import entries, imports, settings, user_dir

    s = settings()
    d = user_dir(s)
    data = {"dir": str(d) if s.enabled else None, "limit_bytes": s.limit_bytes,
            "images": entries(d) if s.enabled else [], "imports": imports(d) if s.enabled else []}
    if json_out:
        from gpuhpc.cli._console import print_json

        print_json(data)
        return 0
    if not s.enabled:
        sys.stdout.write("no node image cache (containers.node_cache_dir is not set)\n")
        return 0
    for e in data["images"]:
        sys.stdout.write(f"{e['bytes'] / 2**20:9.1f} MB  {e['file']}\n")
    n = sum(1 for r in data["imports"] if r.get("event") == "import")
    sys.stdout.write(f"{len(data['images'])} image(s) in {d}; {n} import(s) recorded\n")
    return 0
