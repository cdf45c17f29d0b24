"""Image references and mounts as pyxis/enroot take them, checked before anything reaches a
script; the site's trust policy (``[containers]`` in the site config).

References (enroot's syntax, what ``srun --container-image`` takes)::

    REGISTRY#REPO[:TAG]            nvcr.io#nvidia/pytorch:24.05-py3, 127.0.0.1:5000#gpuhpc/test:1
    REGISTRY#REPO@sha256:DIGEST    pinned: the registry's manifest digest
    REPO[:TAG]                     Docker Hub (registry docker.io): ubuntu:22.04

A ``/`` in place of ``#`` (Docker's spelling) is refused with the fix: enroot would read the
host as the first path component of a Docker Hub repository.

Stdlib only (the CLI's start-up path).
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuhpc.errors import UserInputError

DOCKER_HUB = "docker.io"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_HOST = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})?)*"
                   r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$")
_REPO = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_MOUNT_PATH = re.compile(r"^/[^,:\s]*$")
MOUNT_FLAGS = ("ro", "rw")


@dataclass(frozen=True)
class ImageRef:
    """A parsed reference: ``registry`` (``docker.io`` for Docker Hub), ``repo``, and a ``tag``
    or a ``digest`` (``sha256:…``) or both."""

    registry: str
    repo: str
    tag: str | None = None
    digest: str | None = None

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def __str__(self) -> str:
        head = self.repo if self.registry == DOCKER_HUB else f"{self.registry}#{self.repo}"
        return head + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def with_digest(self, digest: str) -> "ImageRef":
        """This image pinned to ``digest`` (the tag dropped: pyxis pulls by the digest alone)."""
        if not _DIGEST.match(digest):
            raise UserInputError(f"{digest!r} is not a sha256 digest", field="digest")
        return ImageRef(self.registry, self.repo, None, digest)


def parse_ref(text: Any, field: str = "image") -> ImageRef:
    """``text`` as an :class:`ImageRef`; anything else (control characters, blanks, commas,
    a Docker-style ``host/repo``, a malformed tag or digest) is a UserInputError naming ``field``."""
    hint = "e.g. nvcr.io#nvidia/pytorch:24.05-py3 or 127.0.0.1:5000#gpuhpc/test@sha256:<64 hex>"
    if not isinstance(text, str) or not text:
        raise UserInputError("expected an image reference", field=field, hint=hint)
    if _CONTROL.search(text) or any(c.isspace() for c in text) or "," in text or "'" in text or '"' in text:
        raise UserInputError(f"{text!r}: blanks, commas, quotes and control characters are not allowed",
                             field=field, hint=hint)
    rest = text
    registry = DOCKER_HUB
    if "#" in rest:
        registry, rest = rest.split("#", 1)
        if not _HOST.match(registry):
            raise UserInputError(f"{registry!r} is not a registry host[:port]", field=field, hint=hint)
    digest = None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST.match(digest):
            raise UserInputError(f"{digest!r} is not a digest (sha256: and 64 lowercase hex digits)",
                                 field=field, hint=hint)
    tag = None
    if ":" in rest.rsplit("/", 1)[-1]:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.match(tag):
            raise UserInputError(f"{tag!r} is not an image tag", field=field, hint=hint)
    if registry == DOCKER_HUB and "/" in rest and ("." in rest.split("/", 1)[0] or ":" in rest.split("/", 1)[0]
                                                  or rest.split("/", 1)[0] == "localhost"):
        host, repo = rest.split("/", 1)
        raise UserInputError(f"{text!r} names a registry with '/': pyxis wants '#' after the registry",
                             field=field, hint=f"write {host}#{repo}{':' + tag if tag else ''}"
                                               f"{'@' + digest if digest else ''}")
    if ":" in rest or not _REPO.match(rest):
        raise UserInputError(f"{rest!r} is not a repository (lowercase letters, digits, . _ - and /)",
                             field=field, hint=hint)
    return ImageRef(registry, rest, tag, digest)


def check_mount(text: Any, field: str = "mounts") -> str:
    """``SRC:DST[:ro|rw]`` with absolute paths and no commas, colons or blanks in them
    (pyxis splits on those); returned unchanged."""
    hint = "e.g. /data/ckpt:/ckpt or /datasets:/data:ro"
    if not isinstance(text, str) or _CONTROL.search(text):
        raise UserInputError(f"{text!r}: expected SRC:DST[:ro] without control characters", field=field, hint=hint)
    parts = text.split(":")
    if len(parts) == 3 and parts[2] not in MOUNT_FLAGS:
        raise UserInputError(f"unknown mount flag {parts[2]!r}", field=field, hint="ro or rw")
    if len(parts) not in (2, 3) or not all(_MOUNT_PATH.match(p) for p in parts[:2]):
        raise UserInputError(f"{text!r} is not SRC:DST[:ro] with absolute paths (no commas, colons or blanks)",
                             field=field, hint=hint)
    if any(seg == ".." for p in parts[:2] for seg in p.split("/")):
        raise UserInputError(f"{text!r}: '..' is not allowed in a mount path", field=field, hint=hint)
    return text


def check_mounts(mounts: Any, field: str = "mounts") -> tuple[str, ...]:
    if isinstance(mounts, str):
        mounts = [mounts]
    if not isinstance(mounts, (list, tuple)):
        raise UserInputError("expected a list of SRC:DST[:ro]", field=field)
    return tuple(check_mount(m, f"{field}[{i}]") for i, m in enumerate(mounts))


def check_container_workdir(path: Any, field: str = "container_workdir") -> str:
    if not isinstance(path, str) or not _MOUNT_PATH.match(path) or _CONTROL.search(path):
        raise UserInputError(f"{path!r} is not an absolute path (no commas, colons or blanks)", field=field,
                             hint="e.g. /workspace")
    return path


# ---------------------------------------------------------------- trust policy
@dataclass(frozen=True)
class Policy:
    """The site's rules: ``allowed_registries`` (empty: any), partitions that take pinned
    images only (``*``: every partition)."""

    allowed_registries: tuple[str, ...] = ()
    require_digest_partitions: tuple[str, ...] = ()
    source: str = ""

    def check(self, ref: ImageRef, partition: str | None, field: str = "image") -> None:
        """Raise UserInputError (exit 2) for an image this site does not run."""
        where = f" (site config {self.source})" if self.source else ""
        if self.allowed_registries and ref.registry not in self.allowed_registries:
            raise UserInputError(f"registry {ref.registry} is not allowed on this cluster{where}",
                                 field=field, hint=f"allowed: {', '.join(self.allowed_registries)}")
        req = self.require_digest_partitions
        if ref.pinned or not req:
            return
        if partition is None and "*" not in req:       # Slurm's default may be one of them
            raise UserInputError(f"{ref} is a tag and the default partition may run only images pinned by "
                                 f"digest (partitions {', '.join(req)}){where}", field=field,
                                 hint=f"pin it (gpuhpc image pin {ref}) or name the partition (--partition)")
        if "*" in req or partition in req:
            raise UserInputError(f"partition {partition or '(default)'} runs only images pinned by digest{where}; "
                                 f"{ref} is a tag", field=field, hint=f"pin it: gpuhpc image pin {ref}")


def _strings(value: Any, name: str, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v and not _CONTROL.search(v) for v in value):
        raise UserInputError(f"containers.{name} must be a list of non-empty strings", field=path)
    return tuple(value)


def policy_from(data: Mapping[str, Any], path: str) -> Policy:
    """The ``[containers]`` table of a site config (already read by :mod:`gpuhpc.config`)."""
    regs = _strings(data.get("allowed_registries", []), "allowed_registries", path)
    for r in regs:
        if r != DOCKER_HUB and not _HOST.match(r):
            raise UserInputError(f"containers.allowed_registries: {r!r} is not a registry host[:port]", field=path)
    parts = _strings(data.get("require_digest_partitions", []), "require_digest_partitions", path)
    return Policy(regs, parts, path)


# the gpuhpc_containers role's policy (its own file, so that it and the gpuhpc_login role's
# config.toml never overwrite each other): read beside /etc/gpuhpc/config.toml, same [containers] keys
POLICY_FILE = "/etc/gpuhpc/containers.toml"


def site_policies(env: Mapping[str, str] | None = None) -> list[Policy]:
    """The policies that bind this user: the site config's (``GPUHPC_SITE_CONFIG`` for root) and
    the containers role's :data:`POLICY_FILE`; for anyone else ``/etc/gpuhpc/config.toml``'s and
    :data:`POLICY_FILE`'s always (an override may add rules, never lift them). Root's
    ``GPUHPC_SITE_CONFIG`` replaces both (root can edit /etc anyway)."""
    from gpuhpc import config

    env = os.environ if env is None else env
    paths = [config.site_config_path(env)]
    if os.geteuid() != 0:
        paths += [config.SITE_CONFIG, POLICY_FILE]
    elif not env.get("GPUHPC_SITE_CONFIG"):
        paths.append(POLICY_FILE)
    return [policy_from(config.read_file(p, "site").get("containers", {}), p) for p in dict.fromkeys(paths)]


def check_image(image: str, partition: str | None, *, field: str = "image",
                policies: Sequence[Policy] | None = None) -> ImageRef:
    """Parse ``image`` and hold it to every binding site policy (exit 2 on a refusal)."""
    ref = parse_ref(image, field)
    for policy in site_policies() if policies is None else policies:
        policy.check(ref, partition, field)
    return ref
