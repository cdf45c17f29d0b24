"""A registry's answer for an image: the digest of a tag (``gpuhpc image pin``), through the
registry's HTTP API (Docker Registry HTTP API v2 / OCI distribution), stdlib only.

The digest is the one the registry reports (``Docker-Content-Digest``) for the manifest it serves
to a client that accepts manifest lists, OCI indexes and v2 manifests: what enroot is given for
``REGISTRY#REPO@sha256:…`` (for a multi-architecture image, the list; enroot picks its platform).
Anonymous bearer tokens (Docker Hub, nvcr.io public images) are fetched as the registry asks.
Plain HTTP only for a registry on the loopback (127.0.0.1, ::1, localhost), as enroot's
``ENROOT_ALLOW_HTTP`` is meant for.
"""
from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from gpuhpc.containers.image import DOCKER_HUB, ImageRef
from gpuhpc.errors import GpuhpcError

ACCEPT = ", ".join((
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
))
_LOOPBACK = re.compile(r"^(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def base_url(registry: str) -> str:
    if registry == DOCKER_HUB:
        return "https://registry-1.docker.io"
    return f"{'http' if _LOOPBACK.match(registry) else 'https'}://{registry}"


def repository(ref: ImageRef) -> str:
    """Docker Hub's one-word repositories live under ``library/``."""
    return f"library/{ref.repo}" if ref.registry == DOCKER_HUB and "/" not in ref.repo else ref.repo


def _bearer(challenge: str, timeout: float) -> str | None:
    """An anonymous token for a ``WWW-Authenticate: Bearer realm=…,service=…,scope=…`` challenge."""
    if not challenge.lower().startswith("bearer "):
        return None
    params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = params.pop("realm", "")
    if not realm.startswith(("https://", "http://")):
        return None
    url = realm + "?" + urllib.parse.urlencode(params)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            data = json.loads(resp.read().decode())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise GpuhpcError(f"cannot get a token from {realm}: {exc}") from exc
    return data.get("token") or data.get("access_token")


def _request(url: str, method: str, token: str | None, timeout: float) -> Any:
    headers = {"Accept": ACCEPT}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return urllib.request.urlopen(urllib.request.Request(url, method=method, headers=headers), timeout=timeout)


def resolve_digest(ref: ImageRef, *, timeout: float = 30.0) -> str:
    """The digest (``sha256:…``) the registry reports for ``ref``'s tag (``latest`` without
    one; its digest when it has only that). Raises GpuhpcError (exit 1) for an unknown image or an unreachable registry."""
    tag = ref.tag or ref.digest or "latest"     # a digest alone: checked to exist
    url = f"{base_url(ref.registry)}/v2/{repository(ref)}/manifests/{urllib.parse.quote(tag)}"
    token = None
    for attempt in range(2):
        method = "HEAD"
        try:
            with _request(url, method, token, timeout) as resp:
                digest = resp.headers.get("Docker-Content-Digest", "")
            if not _DIGEST.match(digest):       # no header: the digest of the manifest's bytes
                method = "GET"
                with _request(url, method, token, timeout) as resp:
                    digest = "sha256:" + hashlib.sha256(resp.read()).hexdigest()
            return digest
        except urllib.error.HTTPError as exc:
            if exc.code == 401 and attempt == 0:
                token = _bearer(exc.headers.get("WWW-Authenticate", ""), timeout)
                if token:
                    continue
            if exc.code in (401, 403):
                raise GpuhpcError(f"{ref.registry} refused access to {ref.repo} ({exc.code})",
                                  hint="a private image: pin it where you are logged in (skopeo inspect)") from exc
            if exc.code == 404:
                raise GpuhpcError(f"{ref.registry} has no {ref.repo}{'@' if tag == ref.digest else ':'}{tag}") from exc
            raise GpuhpcError(f"{ref.registry} answered {exc.code} for {ref.repo}:{tag}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise GpuhpcError(f"cannot reach the registry {ref.registry}: {reason}") from exc
    raise GpuhpcError(f"{ref.registry} refused access to {ref.repo}")


def pin(ref: ImageRef, *, timeout: float = 30.0) -> ImageRef:
    """``ref`` pinned to the digest its registry reports now."""
    return ref.with_digest(resolve_digest(ref, timeout=timeout))
