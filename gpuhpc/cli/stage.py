"""``gpuhpc stage``: move datasets and checkpoints between S3 and node-local storage."""
from __future__ import annotations

import click

from gpuhpc.cli._console import print_json
from gpuhpc.cli.main import help_for


class _Bar:
    """A rich progress bar on stderr when it is a terminal (the stager's ``progress``); jobs and
    pipes get none."""

    def __init__(self, what: str) -> None:
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                                   TransferSpeedColumn)

        from gpuhpc.cli._console import err_console

        self.what = what
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                            TimeRemainingColumn(), console=err_console(), transient=True)
        self.task = None

    def start(self, total: int) -> None:
        self.bar.start()
        self.task = self.bar.add_task(self.what, total=total)

    def advance(self, n: int) -> None:
        self.bar.update(self.task, advance=n)

    def __enter__(self) -> "_Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.stop()


def _stager(what: str):
    """(stager, bar or None)."""
    import sys

    from gpuhpc.staging.s3 import S3Stager

    bar = _Bar(what) if sys.stderr.isatty() else None
    return S3Stager.from_env(progress=bar), bar


@click.group("stage", help=help_for("stage"), no_args_is_help=True)
def stage() -> None:
    pass


@stage.command("push")
@click.argument("local")
@click.argument("url")
@click.option("--create-bucket", is_flag=True, help="create the bucket if missing")
def push(local: str, url: str, create_bucket: bool) -> None:
    """Upload a file or directory tree LOCAL to URL (s3://BUCKET/PREFIX; multipart for large files)."""
    from gpuhpc.staging.s3 import S3Url

    dest = S3Url.parse(url, "URL")
    stager, bar = _stager(f"push {dest}")
    if create_bucket:
        stager.ensure_bucket(dest.bucket)
    if bar is None:
        n = stager.push(local, dest)
    else:
        with bar:
            n = stager.push(local, dest)
    click.echo(f"pushed {n} file(s) to {dest}")


@stage.command("pull")
@click.argument("url")
@click.argument("local", required=False)
@click.option("--cache", is_flag=True, help="use your node-local cache (${GPUHPC_SCRATCH_ROOT:-/tmp}/gpuhpc-cache-UID, "
                                            "or $GPUHPC_NODE_CACHE_ROOT/UID); prints the path")
@click.option("--latest", is_flag=True, help="only the newest object under the prefix (checkpoints)")
def pull(url: str, local: str | None, cache: bool, latest: bool) -> None:
    """Download URL (s3://BUCKET/PREFIX or an object) to LOCAL (omit with --cache); each file
    lands atomically."""
    from gpuhpc.errors import UserInputError
    from gpuhpc.staging.s3 import S3Url

    src = S3Url.parse(url, "URL")
    stager, bar = _stager(f"pull {src}")
    if latest:
        newest = stager.latest(src)
        if newest is None:
            raise UserInputError(f"nothing under {src}", field="URL")
        src = newest
    if cache:
        from gpuhpc.staging.cache import NodeCache

        if bar is None:
            path, fetched = NodeCache(stager).fetch(src)
        else:
            with bar:
                path, fetched = NodeCache(stager).fetch(src)
        click.echo(str(path))
        return
    if not local:
        raise UserInputError("missing destination", field="LOCAL", hint="give a path or use --cache")
    if bar is None:
        n = stager.pull(src, local)
    else:
        with bar:
            n = stager.pull(src, local)
    click.echo(f"pulled {n} file(s) from {src} to {local}", err=True)


@stage.command("presign")
@click.argument("url")
@click.option("--expires", type=click.IntRange(1, 7 * 24 * 3600), default=3600, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def presign(url: str, expires: int, as_json: bool) -> None:
    """A time-limited HTTPS GET URL for an object (share a checkpoint without credentials)."""
    from gpuhpc.staging.s3 import S3Stager, S3Url

    signed = S3Stager.from_env().presign(S3Url.parse(url, "URL"), expires)
    if as_json:
        print_json({"url": signed, "expires_s": expires})
    else:
        click.echo(signed)

