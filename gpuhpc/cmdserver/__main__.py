"""``python -m gpuhpc.cmdserver serve --socket PATH``: run the command server in the
foreground. Use ``gpuhpc cmdserver start|stop|status`` interactively.

``python -m gpuhpc.cmdserver autostart SOCKET ARGS...`` is what the C client runs when it
finds no server on SOCKET: it starts one in the background if the command server is enabled
(:func:`gpuhpc.config.cmdserver`), then runs ``gpuhpc ARGS...`` in this process, as the plain
Python CLI would. The decision stays in Python, next to the one reader of the config files."""
from __future__ import annotations

import argparse
import os
import sys

from gpuhpc.config import getenv


def autostart(sock: str, args: list[str]) -> int:
    try:
        from gpuhpc import config

        if config.cmdserver().enabled:
            from gpuhpc.cmdserver.server import spawn

            spawn(sock)
    except Exception:  # noqa: BLE001 - a bad config or a failed start never stops the command
        pass           # (`gpuhpc cmdserver status` reports the config's error)
    sys.argv = ["gpuhpc", *args]
    from gpuhpc.cli import entry

    return entry()


def main(argv: list[str] | None = None) -> int:
    from gpuhpc.cmdserver import ensure_private_dir, socket_path

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["autostart"] and len(argv) >= 2:
        return autostart(argv[1], argv[2:])
    p = argparse.ArgumentParser(prog="python -m gpuhpc.cmdserver")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="run the server in the foreground")
    s.add_argument("--socket", default=None, help="socket path (default: this interpreter's)")
    s.add_argument("--idle", type=float, default=getenv("GPUHPC_CMDSERVER_IDLE"),
                   help="exit after this many seconds without a command (default 900)")
    s.add_argument("--log", default=None, help="append events here (default: next to the socket)")
    ns = p.parse_args(argv)
    from gpuhpc.cmdserver.server import serve

    sock = ns.socket or socket_path()
    try:
        ensure_private_dir(os.path.dirname(sock) or ".")
    except PermissionError as exc:
        sys.stderr.write(f"error: --socket: {exc}\n")
        return 2
    log_path = ns.log or sock.rsplit(".", 1)[0] + ".log"
    try:
        log = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600),
                        "a", encoding="utf-8")
    except OSError:
        log = None
    return serve(sock, idle=ns.idle, log=log)


if __name__ == "__main__":
    sys.exit(main())
