"""Stage datasets and checkpoints to and from S3 (AWS or any S3 server: SeaweedFS, MinIO, Ceph).

Configuration comes from the usual AWS variables (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) plus ``GPUHPC_S3_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL``) for a non-AWS server. Downloads are atomic per file (temp name, then
rename), so a job that is preempted mid-download never sees a half-written file.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from boto3.exceptions import Boto3Error
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, ProfileNotFound

from gpuhpc.config import getenv
from gpuhpc.errors import StagingError, UserInputError
from gpuhpc.fsutil import atomic_path, sha256_file

MB = 1024 * 1024


@dataclass(frozen=True)
class S3Url:
    bucket: str
    key: str

    @classmethod
    def parse(cls, url: str, field: str = "url") -> "S3Url":
        if not url.startswith("s3://") or len(url) <= 5:
            raise UserInputError(f"not an S3 URL: {url!r}", field=field, hint="use s3://BUCKET/PREFIX")
        bucket, _, key = url[5:].partition("/")
        if not bucket or any(ord(c) < 32 for c in url):
            raise UserInputError(f"invalid S3 URL: {url!r}", field=field, hint="use s3://BUCKET/PREFIX")
        return cls(bucket, key)

    def child(self, name: str) -> "S3Url":
        base = self.key.rstrip("/")
        return S3Url(self.bucket, f"{base}/{name}" if base else name)

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


@dataclass(frozen=True)
class RemoteObject:
    key: str
    size: int
    etag: str
    last_modified: float


# What one read from a GET's body asks for: as s3transfer's 256 KB. urllib3 assembles a larger
# read from many socket reads into one buffer, and at 1 MB that doubled the CPU per byte.
READ_SIZE = 256 * 1024


class S3Stager:
    def __init__(self, *, endpoint_url: str | None = None, region: str | None = None,
                 access_key: str | None = None, secret_key: str | None = None,
                 multipart_threshold: int = 8 * MB, multipart_chunksize: int = 8 * MB,
                 max_concurrency: int = 10, progress=None) -> None:
        self.endpoint_url = endpoint_url
        self.gets = 0                   # GetObject requests made (a cache hit makes none)
        self.progress = progress        # None (quiet: jobs), or an object with start(total) / advance(n)
        try:
            self._client = boto3.client(
                "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1",
                aws_access_key_id=access_key, aws_secret_access_key=secret_key,
                config=Config(retries={"max_attempts": 5, "mode": "standard"},
                              s3={"addressing_style": "path"} if endpoint_url else None),
            )
        except ProfileNotFound as exc:
            raise UserInputError(str(exc), field="AWS_PROFILE", hint="name a profile of ~/.aws/config") from exc
        except (BotoCoreError, ValueError) as exc:
            raise StagingError(f"cannot set up the S3 client: {exc}") from exc
        self._client.meta.events.register("before-call.s3.GetObject", self._count_get)
        self._transfer = TransferConfig(multipart_threshold=multipart_threshold,
                                        multipart_chunksize=multipart_chunksize,
                                        max_concurrency=max_concurrency)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, **kwargs) -> "S3Stager":
        env = dict(os.environ if env is None else env)
        return cls(endpoint_url=getenv("GPUHPC_S3_ENDPOINT_URL", env) or env.get("AWS_ENDPOINT_URL") or None,
                   region=env.get("AWS_DEFAULT_REGION") or env.get("AWS_REGION") or None,
                   access_key=env.get("AWS_ACCESS_KEY_ID") or None,
                   secret_key=env.get("AWS_SECRET_ACCESS_KEY") or None, **kwargs)

    # ------------------------------------------------------------ helpers
    def _count_get(self, **_kwargs) -> None:
        self.gets += 1

    def _start(self, total: int) -> None:
        if self.progress is not None:
            self.progress.start(total)

    def _callback(self):
        return self.progress.advance if self.progress is not None else None

    def _call(self, what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except NoCredentialsError as exc:
            raise _no_credentials() from exc
        except (ClientError, BotoCoreError, Boto3Error) as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
            raise StagingError(f"S3 {what} failed{f' ({code})' if code else ''}: {exc}") from exc

    def ensure_bucket(self, bucket: str) -> None:
        try:
            self._client.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
                self._call(f"create bucket {bucket}", self._client.create_bucket, Bucket=bucket)
            else:
                raise StagingError(f"S3 head bucket {bucket} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StagingError(f"S3 head bucket {bucket} failed: {exc}") from exc

    def list(self, url: S3Url) -> Iterator[RemoteObject]:
        paginator = self._client.get_paginator("list_objects_v2")
        prefix = url.key
        try:
            for page in paginator.paginate(Bucket=url.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    yield RemoteObject(obj["Key"], obj["Size"], obj["ETag"].strip('"'),
                                       obj["LastModified"].timestamp())
        except NoCredentialsError as exc:
            raise _no_credentials() from exc
        except (ClientError, BotoCoreError) as exc:
            raise StagingError(f"S3 list {url} failed: {exc}") from exc

    # ------------------------------------------------------------ push / pull
    def push(self, local: str | Path, url: S3Url) -> int:
        """Upload a file, or a directory tree under the URL's prefix. Returns files sent."""
        src = Path(local)
        if not src.exists():
            raise UserInputError(f"{src} does not exist", field="LOCAL")
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        self._start(sum(p.stat().st_size for p in files))
        for path in files:
            key = url.key if src.is_file() and url.key and not url.key.endswith("/") else \
                url.child(path.name if src.is_file() else path.relative_to(src).as_posix()).key
            sha = sha256_file(path)
            self._call(f"upload {path}", self._client.upload_file, str(path), url.bucket, key,
                       ExtraArgs={"Metadata": {"sha256": sha}}, Config=self._transfer, Callback=self._callback())
        return len(files)

    def pull(self, url: S3Url, local: str | Path) -> int:
        """Download an object or every object under a prefix into ``local`` (a dir for a
        prefix). Each file lands atomically. Returns files fetched."""
        dest = Path(local)
        objs = list(self.list(url))
        exact = [o for o in objs if o.key == url.key]
        if exact and not url.key.endswith("/"):
            target = dest / Path(url.key).name if dest.is_dir() else dest
            self._start(exact[0].size)
            self._download(url.bucket, exact[0], target)
            return 1
        base = url.key.rstrip("/") + "/" if url.key else ""
        todo = []
        for obj in objs:
            if not obj.key.startswith(base) or obj.key.endswith("/"):
                continue
            rel = obj.key[len(base):]
            if ".." in Path(rel).parts or rel.startswith("/"):
                raise StagingError(f"refusing to write outside {dest}: key {obj.key!r}")
            todo.append((obj, dest / rel))
        if not todo:
            raise StagingError(f"nothing found at {url}")
        self._start(sum(o.size for o, _ in todo))
        self._download_many(url.bucket, todo)
        return len(todo)

    def _download_many(self, bucket: str, items: list[tuple[RemoteObject, Path]]) -> None:
        """Objects up to ``multipart_threshold`` one GET each, ``max_concurrency`` at a time (no
        HEAD: the LIST gave sizes and ETags); larger ones one after another, each in parallel
        parts (:meth:`_download`). Each file lands atomically."""
        from concurrent.futures import ThreadPoolExecutor

        small = [(o, t) for o, t in items if o.size <= self._transfer.multipart_threshold]
        large = [(o, t) for o, t in items if o.size > self._transfer.multipart_threshold]
        if len(small) <= 1:
            for obj, target in small + large:
                self._download(bucket, obj, target)
            return
        with ThreadPoolExecutor(self._transfer.max_concurrency) as pool:
            futures = [pool.submit(self._download, bucket, o, t) for o, t in small]
            try:
                for obj, target in large:
                    self._download(bucket, obj, target)
                for f in futures:
                    f.result()
            finally:
                for f in futures:
                    f.cancel()

    def _download(self, bucket: str, obj: RemoteObject, target: Path) -> None:
        """One object, as boto3's ``download_file`` splits it (parts of ``multipart_chunksize``
        on ``max_concurrency`` threads) but with less work per byte: no HEAD (the LIST gave the
        size and ETag), and each thread writes its part in place (``pwrite`` into the file,
        sized first) instead of queueing 256 KB pieces to one writer thread. Every GET names
        the listed ETag (``If-Match``): an object replaced midway fails instead of mixing two
        versions. Each part's length is checked; a part cut off by the network is fetched
        again (as s3transfer does)."""
        with atomic_path(target, mode=None) as tmp:
            self._call(f"download s3://{bucket}/{obj.key}", self._fetch_parts, bucket, obj, tmp)

    def _fetch_parts(self, bucket: str, obj: RemoteObject, path: Path) -> None:
        from concurrent.futures import ThreadPoolExecutor

        part = max(self._transfer.multipart_chunksize, 1)
        starts = list(range(0, obj.size, part)) if obj.size > self._transfer.multipart_threshold else [0]
        os.unlink(path)                                 # made again: the mode boto3 gives (0666 less the umask)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.ftruncate(fd, obj.size)
            if obj.size == 0:
                return
            if len(starts) == 1:
                self._fetch_part(bucket, obj, fd, 0, obj.size - 1)
                return
            with ThreadPoolExecutor(min(self._transfer.max_concurrency, len(starts))) as pool:
                futures = [pool.submit(self._fetch_part, bucket, obj, fd, a, min(a + part, obj.size) - 1)
                           for a in starts]
                try:
                    for f in futures:
                        f.result()
                finally:
                    for f in futures:
                        f.cancel()
        finally:
            os.close(fd)

    def _fetch_part(self, bucket: str, obj: RemoteObject, fd: int, first: int, last: int,
                    attempts: int = 5) -> None:
        """Bytes ``first..last`` of ``obj`` written at their offsets of ``fd``."""
        from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

        advance = self._callback()
        for attempt in range(attempts):
            pos = first
            try:
                body = self._client.get_object(Bucket=bucket, Key=obj.key, Range=f"bytes={first}-{last}",
                                               IfMatch=f'"{obj.etag}"')["Body"]
                while chunk := body.read(READ_SIZE):
                    os.pwrite(fd, chunk, pos)
                    pos += len(chunk)
                    if advance is not None:
                        advance(len(chunk))
            except S3_RETRYABLE_DOWNLOAD_ERRORS:
                if advance is not None:
                    advance(first - pos)                # those bytes come again
                if attempt == attempts - 1:
                    raise
                continue
            if pos != last + 1:
                raise StagingError(f"S3 download s3://{bucket}/{obj.key}: bytes {first}-{last} came back "
                                   f"{pos - first} long")
            return

    def put_bytes(self, data: bytes, url: S3Url) -> None:
        self._call(f"upload {url}", self._client.put_object, Bucket=url.bucket, Key=url.key, Body=data)

    def get_bytes(self, url: S3Url) -> bytes:
        r = self._call(f"download {url}", self._client.get_object, Bucket=url.bucket, Key=url.key)
        return self._call(f"download {url}", r["Body"].read)

    def latest(self, url: S3Url) -> S3Url | None:
        """Newest object under a prefix (e.g. the latest checkpoint), or None."""
        objs = list(self.list(url))
        if not objs:
            return None
        newest = max(objs, key=lambda o: (o.last_modified, o.key))
        return S3Url(url.bucket, newest.key)

    def presign(self, url: S3Url, expires_s: int = 3600) -> str:
        return self._call("presign", self._client.generate_presigned_url, "get_object",
                          Params={"Bucket": url.bucket, "Key": url.key}, ExpiresIn=expires_s)

    def head(self, url: S3Url) -> RemoteObject:
        r = self._call(f"head {url}", self._client.head_object, Bucket=url.bucket, Key=url.key)
        return RemoteObject(url.key, r["ContentLength"], r["ETag"].strip('"'), r["LastModified"].timestamp())


def _no_credentials() -> StagingError:
    return StagingError("no S3 credentials found",
                        hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or ~/.aws/credentials "
                             "(boto3's usual chain)")


