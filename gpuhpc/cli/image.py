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
