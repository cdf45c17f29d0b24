"""``gpuhpc cmdserver ...``: the optional, opt-in fast front-end (design: :mod:`gpuhpc.cmdserver`,
settings: :mod:`gpuhpc.config`, docs/cmdserver.md)."""
from __future__ import annotations

import click

from gpuhpc.cli.main import help_for


@click.group("cmdserver", help=help_for("cmdserver"), no_args_is_help=True)
def cmdserver() -> None:
    pass


@cmdserver.command("status")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def status(as_json: bool) -> None:
    """Is the command server enabled, is one running for this install, which gpuhpc is installed."""
    from gpuhpc import config
    from gpuhpc.cli._console import console, print_json
    from gpuhpc.cmdserver import build, socket_path
    from gpuhpc.cmdserver.server import running_pid
    from gpuhpc.errors import UserInputError

    try:
        setting = config.cmdserver()
        enabled, why = setting.enabled, setting.reason
    except UserInputError as exc:      # say so, and still show the rest
        enabled, why = False, f"config error: {exc.one_line()}"
    sock = socket_path()
    try:
        pid = running_pid(sock)
    except PermissionError as exc:     # a directory or lock file another user could write
        pid, why = None, f"{why}; refusing the socket directory: {exc}"
    dest = build.default_dest()
    site, user = config.config_paths()
    data = {"enabled": enabled, "why": why, "site_config": site, "user_config": user,
            "socket": sock, "running": bool(pid), "pid": pid if pid and pid > 0 else None,
            "client": dest, "client_kind": build.kind(dest)}
    if as_json:
        print_json(data)
        return
    lines = [f"enabled: {'yes' if enabled else 'no'} ({why})",
             f"server: {'running (pid %s)' % data['pid'] if pid else 'not running'}",
             f"socket: {sock}", f"client: {dest} ({data['client_kind']})"]
    console().print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)


@cmdserver.command("start")
@click.option("--idle", type=click.FloatRange(min=1.0), default=900.0, show_default=True,
              help="Exit after this many seconds without a command.")
def start(idle: float) -> None:
    """Start the server now (the compiled client also starts one on first use, when enabled)."""
    from gpuhpc.cli._console import console
    from gpuhpc.cmdserver import socket_path
    from gpuhpc.cmdserver.server import start as start_server

    sock = socket_path()
    pid = start_server(sock, idle=idle)
    console().print(f"command server running (pid {pid}) on {sock}", markup=False, highlight=False)


@cmdserver.command("stop")
def stop() -> None:
    """Stop the server; commands it is running finish first."""
    from gpuhpc.cli._console import console
    from gpuhpc.cmdserver import socket_path
    from gpuhpc.cmdserver.server import stop as stop_server

    pid = stop_server(socket_path())
    console().print(f"stopped the command server (pid {pid})" if pid else "no command server was running",
                    markup=False, highlight=False)


@cmdserver.command("install-client")
@click.option("--dest", help="Where to install (default: the gpuhpc console script of this install, which it replaces).")
@click.option("--cc", help="C compiler (default: $CC, else cc).")
def install_client(dest: str | None, cc: str | None) -> None:
    """Compile the C client and install it as ``gpuhpc``; needs ``[cmdserver] enabled = true``
    in your config. Undo: ``gpuhpc cmdserver uninstall-client``."""
    from gpuhpc import config
    from gpuhpc.cli._console import console
    from gpuhpc.cmdserver import build
    from gpuhpc.errors import UserInputError

    setting = config.cmdserver()
    if not setting.enabled:
        raise UserInputError(f"the command server is {setting.reason}", hint=setting.hint or None)
    path = build.install(dest, cc=cc)
    console().print(f"installed the gpuhpc client at {path} (undo: gpuhpc cmdserver uninstall-client)",
                    markup=False, highlight=False)


@cmdserver.command("uninstall-client")
@click.option("--dest", help="Where the client is (default: this install's gpuhpc).")
@click.option("--if-disabled", is_flag=True, help="Only when the command server is not enabled (bootstrap.sh).")
def uninstall_client(dest: str | None, if_disabled: bool) -> None:
    """Put the Python console script back in place of the compiled client, and stop the server."""
    from gpuhpc import config
    from gpuhpc.cli._console import console
    from gpuhpc.cmdserver import build, socket_path
    from gpuhpc.cmdserver.server import stop as stop_server
    from gpuhpc.errors import UserInputError

    if if_disabled:
        try:
            if config.cmdserver().enabled:
                return
        except UserInputError:
            pass                           # a broken config enables nothing
    path = dest or build.default_dest()
    changed = build.uninstall(path)
    stop_server(socket_path())
    console().print(f"restored the Python console script at {path}" if changed
                    else f"{path} is not the compiled client; nothing to do", markup=False, highlight=False)
