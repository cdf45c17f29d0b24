"""The command server's wire protocol (the C side is ``client.c``), and the caller identity a
worker must share before it may serve a command.

Client -> server, once per connection::

    "GPH2" u32 LEN   (big-endian), with SCM_RIGHTS carrying the client's fds 0, 1, 2
    LEN bytes of NUL-terminated fields:
        cwd, umask (octal),
        ids     "RUID EUID RGID EGID",
        groups  the supplementary group ids, ascending, space-separated ("" for none),
        rlimits "N SOFT0 HARD0 ... SOFT(N-1) HARD(N-1)" for every RLIMIT_* 0..N-1
                (getrlimit; -1 is RLIM_INFINITY),
        argc, argv[0..argc), then environment entries "KEY=VALUE" to the end.

Server -> client and worker -> master: 5-byte messages, a code (:class:`Msg`) and an i32.
"""
from __future__ import annotations

import enum
import os
import socket
import struct
from dataclasses import dataclass

MAGIC = b"GPH2"
HEADER = struct.Struct("!4sI")
MESSAGE = struct.Struct("!ci")
MAX_REQUEST = 64 << 20                 # argv + environment
_FDS = struct.Struct("3i")


class Msg(bytes, enum.Enum):
    """The one-byte message codes."""

    # worker -> client
    STARTED = b"P"        # value: the worker's pid, which leads the command's process group
    EXITED = b"X"         # value: the command's exit code; the last message
    DECLINED = b"F"       # value: a Decline; nothing ran, the client runs the Python CLI itself
    # worker -> master (over the notification pipe)
    ACCEPTED = b"A"       # value: worker pid; it is now busy
    READY = b"R"          # value: worker pid; back in accept()
    STALE = b"S"          # value: worker pid; code or config changed: the master stops


class Decline(enum.IntEnum):
    """Why a worker did not serve a request (the value of a DECLINED message)."""

    STALE = 1             # gpuhpc's code or config changed since the server started
    PYTHON_ENV = 2        # PYTHON* variables differ from the server's
    IDENTITY = 3          # uid, gid or supplementary groups differ from the worker's
    LIMITS = 4            # a resource limit (soft or hard) differs from the worker's


def pack(code: Msg, value: int) -> bytes:
    return MESSAGE.pack(code.value, value)


def unpack(data: bytes) -> tuple[Msg, int]:
    code, value = MESSAGE.unpack(data)
    return Msg(code), value


def _rlimit_names() -> dict[int, str]:
    import resource

    names: dict[int, str] = {}
    for name in sorted(dir(resource)):
        if name.startswith("RLIMIT_") and name != "RLIMIT_OFILE":
            names[getattr(resource, name)] = name
    return names


@dataclass(frozen=True)
class Identity:
    """What a job submitted from a process inherits from it besides argv, env, cwd and umask:
    Slurm records the submitter's uid and gid and propagates its resource limits
    (``PropagateResourceLimits=ALL`` by default). Fields are in wire form."""

    ids: str
    groups: str
    rlimits: str

    @classmethod
    def of_this_process(cls) -> Identity:
        import resource

        limits: list[str] = []
        n = 0
        while True:
            try:
                soft, hard = resource.getrlimit(n)
            except ValueError:
                break
            limits += (str(soft), str(hard))
            n += 1
        return cls(ids=" ".join(str(i) for i in (os.getuid(), os.geteuid(), os.getgid(), os.getegid())),
                   groups=" ".join(str(g) for g in sorted(set(os.getgroups()))),
                   rlimits=" ".join([str(n), *limits]))

    def mismatch(self, caller: Identity) -> tuple[Decline, str] | None:
        """None when ``caller`` equals this identity; else the reason, in words."""
        if caller.ids != self.ids:
            return Decline.IDENTITY, f"uid/gid {caller.ids!r} != {self.ids!r}"
        if caller.groups != self.groups:
            return Decline.IDENTITY, f"groups {caller.groups!r} != {self.groups!r}"
        if caller.rlimits != self.rlimits:
            mine, theirs = self.rlimits.split(), caller.rlimits.split()
            if mine[:1] != theirs[:1] or len(mine) != len(theirs):
                return Decline.LIMITS, f"{theirs[:1]} resource limits sent, {mine[0]} here"
            names = _rlimit_names()
            diff = [f"{names.get(i, i)} {theirs[1 + 2 * i]}/{theirs[2 + 2 * i]} != "
                    f"{mine[1 + 2 * i]}/{mine[2 + 2 * i]}"
                    for i in range(int(mine[0])) if theirs[1 + 2 * i:3 + 2 * i] != mine[1 + 2 * i:3 + 2 * i]]
            return Decline.LIMITS, ", ".join(diff)
        return None


@dataclass
class Request:
    cwd: str
    umask: int
    identity: Identity
    argv: list[str]
    env: dict[str, str]


def parse_request(payload: bytes) -> Request:
    """The request fields (everything after the header); ValueError if malformed."""
    fields = payload.split(b"\0")
    if len(fields) < 7 or fields[-1] != b"":
        raise ValueError("truncated request")
    cwd, umask = os.fsdecode(fields[0]), int(fields[1], 8)
    identity = Identity(*(f.decode("ascii") for f in fields[2:5]))
    argc = int(fields[5])
    argv = [os.fsdecode(a) for a in fields[6:6 + argc]]
    if argc < 0 or len(argv) != argc:
        raise ValueError("truncated argv")
    env = {}
    for item in fields[6 + argc:-1]:
        key, sep, value = item.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return Request(cwd, umask, identity, argv, env)


def encode_request(req: Request) -> bytes:
    """Header and payload, as ``client.c`` sends them (the fds go alongside)."""
    fields = [os.fsencode(req.cwd), b"%o" % req.umask, req.identity.ids.encode(), req.identity.groups.encode(),
              req.identity.rlimits.encode(), b"%d" % len(req.argv), *map(os.fsencode, req.argv),
              *(os.fsencode(f"{k}={v}") for k, v in req.env.items())]
    payload = b"".join(f + b"\0" for f in fields)
    return HEADER.pack(MAGIC, len(payload)) + payload


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        b = conn.recv(min(n - got, 1 << 20))
        if not b:
            raise ConnectionError("client went away")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_request(conn: socket.socket) -> tuple[list[int], Request]:
    """-> (the client's fds 0, 1, 2, the request); raises ConnectionError/ValueError on
    anything malformed, having closed any fds received."""
    data, anc, _flags, _addr = conn.recvmsg(HEADER.size, socket.CMSG_SPACE(_FDS.size))
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(struct.unpack(f"{usable // 4}i", payload[:usable]))
    try:
        if len(data) < HEADER.size:
            data += _recv_exact(conn, HEADER.size - len(data))
        magic, length = HEADER.unpack(data)
        if magic != MAGIC or length > MAX_REQUEST or len(fds) != 3:
            raise ValueError("not a gpuhpc client request")
        return fds, parse_request(_recv_exact(conn, length))
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def send(conn: socket.socket, code: Msg, value: int) -> None:
    conn.sendall(MESSAGE.pack(code.value, value))
