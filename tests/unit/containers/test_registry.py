"""gpuhpc.containers.registry against an in-process registry (HTTP API v2 with a bearer
challenge, as Docker Hub and nvcr.io answer): the digest header, the manifest-bytes fallback,
anonymous tokens, 404 -> exit 1."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuhpc.containers import registry
from gpuhpc.containers.image import parse_ref
from gpuhpc.errors import GpuhpcError

MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()


@pytest.fixture
def server():
    seen: list[tuple[str, str, str]] = []
    state = {"header": True, "auth": False}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _manifest(self, body: bool):
            seen.append((self.command, self.path, self.headers.get("Accept", "")))
            if state["auth"] and self.headers.get("Authorization") != "Bearer t0k":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",'
                                                     'service="reg",scope="repository:team/app:pull"')
                self.end_headers()
                return
            if self.path != "/v2/team/app/manifests/v1":
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            if state["header"]:
                self.send_header("Docker-Content-Digest", DIGEST)
            self.send_header("Content-Length", str(len(MANIFEST)))
            self.end_headers()
            if body:
                self.wfile.write(MANIFEST)

        def do_HEAD(self):
            self._manifest(False)

        def do_GET(self):
            if self.path.startswith("/token?"):
                seen.append(("GET", self.path, ""))
                data = json.dumps({"token": "t0k"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self._manifest(True)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{port}", state, seen
    httpd.shutdown()


def test_digest_header(server):
    reg, _, seen = server
    pinned = registry.pin(parse_ref(f"{reg}#team/app:v1"))
    assert str(pinned) == f"{reg}#team/app@{DIGEST}"
    method, path, accept = seen[0]
    assert method == "HEAD" and "manifest.list.v2+json" in accept and "oci.image.index" in accept


def test_no_header_hashes_the_manifest_and_token_flow(server):
    reg, state, seen = server
    state.update(header=False, auth=True)
    assert registry.resolve_digest(parse_ref(f"{reg}#team/app:v1")) == DIGEST
    assert any(p.startswith("/token?") and "scope=repository%3Ateam%2Fapp%3Apull" in p for _, p, _ in seen)


def test_unknown_tag_and_unreachable_registry_exit_1(server):
    reg, _, _ = server
    with pytest.raises(GpuhpcError, match="has no team/app:v2") as e:
        registry.resolve_digest(parse_ref(f"{reg}#team/app:v2"))
    assert e.value.exit_code == 1
    with pytest.raises(GpuhpcError, match="cannot reach the registry 127.0.0.1:1"):
        registry.resolve_digest(parse_ref("127.0.0.1:1#team/app:v1"), timeout=5)


def test_urls():
    assert registry.base_url("docker.io") == "https://registry-1.docker.io"
    assert registry.base_url("nvcr.io") == "https://nvcr.io"
    assert registry.base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert registry.repository(parse_ref("ubuntu:22.04")) == "library/ubuntu"
    assert registry.repository(parse_ref("nvcr.io#nvidia/pytorch:1")) == "nvidia/pytorch"
