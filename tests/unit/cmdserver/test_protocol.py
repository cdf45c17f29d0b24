"""The command server's wire protocol and caller-identity check, in-process: no compiler, no
server, no sockets beyond a socketpair."""
from __future__ import annotations

import os
import re
import resource
import socket
from pathlib import Path

import pytest

from gpuhpc.cmdserver import protocol
from gpuhpc.cmdserver.protocol import Decline, Identity, Msg, Request

CLIENT_C = Path(protocol.__file__).with_name("client.c").read_text()


def _request(**kw) -> Request:
    base = dict(cwd="/work/dir ü", umask=0o027, identity=Identity.of_this_process(),
                argv=["gpuhpc", "submit", "--name", "x; y", "--", "echo", ""], env={"A": "1", "B": "x=y", "E": ""})
    return Request(**{**base, **kw})


def test_a_request_round_trips():
    req = _request()
    wire = protocol.encode_request(req)
    magic, length = protocol.HEADER.unpack(wire[:protocol.HEADER.size])
    assert magic == protocol.MAGIC and length == len(wire) - protocol.HEADER.size
    assert protocol.parse_request(wire[protocol.HEADER.size:]) == req


@pytest.mark.parametrize("payload", [
    b"", b"/\x000\x00", b"/\x0022\x000 0 0 0\x00\x001 0 0\x003\x00gpuhpc\x00",          # argv cut short
    b"/\x0022\x000 0 0 0\x00\x001 0 0\x00x\x00gpuhpc\x00",                              # argc not a number
    b"/\x00z\x000 0 0 0\x00\x001 0 0\x000\x00",                                         # umask not octal
    b"/\x0022\x00\xff\x00\x001 0 0\x000\x00",                                           # ids not ASCII
    b"/\x0022\x000 0 0 0\x00\x001 0 0\x000",                                            # no final NUL
])
def test_malformed_requests_are_refused(payload):
    with pytest.raises(ValueError):
        protocol.parse_request(payload)


def test_read_request_takes_the_fds_and_refuses_a_foreign_magic():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        wire = protocol.encode_request(_request())
        socket.send_fds(a, [wire[:protocol.HEADER.size]], [r, w, w])
        a.sendall(wire[protocol.HEADER.size:])
        fds, req = protocol.read_request(b)
        assert len(fds) == 3 and req == _request()
        for fd in fds:
            os.close(fd)
        socket.send_fds(a, [b"GPH1" + wire[4:protocol.HEADER.size]], [r, w, w])   # the old protocol
        with pytest.raises(ValueError):
            protocol.read_request(b)
    finally:
        for s in (a, b):
            s.close()
        os.close(r)
        os.close(w)


def test_message_codes_are_distinct_bytes_and_match_the_client():
    codes = [m.value for m in Msg]
    assert len(set(codes)) == len(codes) and all(len(c) == 1 for c in codes)
    for msg in (Msg.STARTED, Msg.EXITED, Msg.DECLINED):
        assert f"'{msg.value.decode()}'" in CLIENT_C
    assert protocol.unpack(protocol.pack(Msg.DECLINED, Decline.LIMITS)) == (Msg.DECLINED, Decline.LIMITS)
    assert "'G', 'P', 'H', '2'" in CLIENT_C and protocol.MAGIC == b"GPH2"


def test_identity_of_this_process():
    me = Identity.of_this_process()
    assert me.ids.split() == [str(i) for i in (os.getuid(), os.geteuid(), os.getgid(), os.getegid())]
    assert me.groups == " ".join(str(g) for g in sorted(set(os.getgroups())))
    fields = me.rlimits.split()
    n = int(fields[0])
    assert n >= 16 and len(fields) == 1 + 2 * n       # RLIMIT_CPU .. RLIMIT_RTTIME on Linux
    nofile = resource.RLIMIT_NOFILE
    assert fields[1 + 2 * nofile:3 + 2 * nofile] == [str(v) for v in resource.getrlimit(nofile)]
    assert re.search(r"RLIM_NLIMITS", CLIENT_C)         # the client sends every limit too


def test_any_difference_in_identity_is_a_reason_to_decline():
    me = Identity.of_this_process()
    assert me.mismatch(Identity(me.ids, me.groups, me.rlimits)) is None
    ids = me.ids.split()
    other_gid = Identity(" ".join(ids[:2] + ["4242", "4242"]), me.groups, me.rlimits)
    assert me.mismatch(other_gid)[0] is Decline.IDENTITY
    assert me.mismatch(Identity(me.ids, (me.groups + " 4242").strip(), me.rlimits))[0] is Decline.IDENTITY
    fields = me.rlimits.split()
    stack = resource.RLIMIT_STACK
    for offset in (1, 2):                               # soft, then hard
        changed = list(fields)
        changed[offset + 2 * stack] = "4424704"
        reason, why = me.mismatch(Identity(me.ids, me.groups, " ".join(changed)))
        assert reason is Decline.LIMITS and why.startswith("RLIMIT_STACK ")
    reason, _ = me.mismatch(Identity(me.ids, me.groups, "2 0 0 0 0"))
    assert reason is Decline.LIMITS
