"""``gpuhpc cmdserver ...``: the optional fast front-end (design: :mod:`gpuhpc.cmdserver`)."""
from __future__ import annotations

import typer

from gpuhpc.cli._console import console, print_json

cmdserver_app = typer.Typer(
    help="The command server behind the compiled gpuhpc client (fast scripted submission).",
    no_args_is_help=True)


def _client_kind(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError:
        return "missing"
    return "compiled client" if head == b"\x7fELF" else "python script"


@cmdserver_app.command("status")
def status(as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Is a server running for this install, where is its socket, which gpuhpc is installed."""
    import os

    from gpuhpc.cmdserver import build, socket_path
    from gpuhpc.cmdserver.server import running_pid

    sock = socket_path()
    pid = running_pid(sock)
    dest = build.default_dest()
    data = {"socket": sock, "running": bool(pid), "pid": pid if pid and pid > 0 else None,
            "client": dest, "client_kind": _client_kind(dest),
            "mode": os.environ.get("GPUHPC_CMDSERVER") or "auto"}
    if as_json:
        print_json(data)
        return
    out = console()
    out.print(f"server: {'running (pid %s)' % data['pid'] if pid else 'not running'}", highlight=False)
    out.print(f"socket: {sock}", highlight=False)
    out.print(f"client: {dest} ({data['client_kind']}); GPUHPC_CMDSERVER={data['mode']}", highlight=False)


@cmdserver_app.command("start")
def start(idle: float = typer.Option(900.0, "--idle", min=1.0,
                                     help="Exit after this many seconds without a command.")) -> None:
    """Start the server now (the compiled client also starts one on first use)."""
    from gpuhpc.cmdserver import socket_path
    from gpuhpc.cmdserver.server import start as start_server

    sock = socket_path()
    pid = start_server(sock, idle=idle)
    console().print(f"command server running (pid {pid}) on {sock}", highlight=False)


@cmdserver_app.command("stop")
def stop() -> None:
    """Stop the server; commands it is running finish first."""
    from gpuhpc.cmdserver import socket_path
    from gpuhpc.cmdserver.server import stop as stop_server

    pid = stop_server(socket_path())
    console().print(f"stopped the command server (pid {pid})" if pid else "no command server was running",
                    highlight=False)


@cmdserver_app.command("install-client")
def install_client(
    dest: str = typer.Option(None, "--dest", help="Where to install (default: the gpuhpc console "
                                                 "script of this install, which it replaces)."),
    cc: str = typer.Option(None, "--cc", help="C compiler (default: $CC, else cc)."),
) -> None:
    """Compile the C client and install it as ``gpuhpc``. Undo: pip install --force-reinstall,
    or GPUHPC_CMDSERVER=off to bypass the server."""
    from gpuhpc.cmdserver import build

    path = build.build(dest, cc=cc)
    console().print(f"installed the gpuhpc client at {path}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(cmdserver_app, name="cmdserver")
