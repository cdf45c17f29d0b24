"""Point 9: ``[cmdserver] allowed = false`` in the site config binds every user: an ordinary user
who points GPUHPC_SITE_CONFIG at a file of their own that allows the server (and enables it in
their config) still gets no server. The test stands a root-owned file in for
/etc/gpuhpc/config.toml (``gpuhpc.config.SITE_CONFIG``), which it may not change on a shared
machine; everything else is the user's."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

_ATTACK = """
import os, sys
from gpuhpc import config
config.SITE_CONFIG = sys.argv[1]            # the harness: the site's /etc/gpuhpc/config.toml
setting = config.cmdserver()
print("enabled" if setting.enabled else f"refused: {setting.reason}")
from gpuhpc.cmdserver.server import serve
rc = serve(sys.argv[2], idle=1)
print(f"serve={rc} socket={os.path.exists(sys.argv[2])}")
"""


def test_a_users_site_config_override_does_not_lift_the_sites_veto(hostile, site_python):
    site_dir = Path(tempfile.mkdtemp(prefix="gpuhpc-sec-site-", dir="/var/tmp"))
    try:
        site_dir.chmod(0o755)
        etc = site_dir / "config.toml"
        etc.write_text("[cmdserver]\nallowed = false\n")
        etc.chmod(0o644)
        own_site, own_user = hostile.workdir / "site.toml", hostile.workdir / "user.toml"
        for path, text in ((own_site, "[cmdserver]\nallowed = true\n"), (own_user, "[cmdserver]\nenabled = true\n")):
            assert hostile.run(["sh", "-c", 'printf "$2" > "$1"', "-", str(path), text]).returncode == 0
        rundir = hostile.workdir / "run"
        assert hostile.run(["mkdir", "-m", "700", str(rundir)]).returncode == 0
        sock = rundir / "cmd-x.sock"
        res = hostile.run([site_python, "-P", "-c", _ATTACK, str(etc), str(sock)],
                          env={"GPUHPC_SITE_CONFIG": str(own_site), "GPUHPC_CONFIG": str(own_user)})
        assert res.returncode == 0, res.stderr
        assert f"refused: forbidden by the site config {etc}" in res.stdout, res.stdout
        assert "serve=2 socket=False" in res.stdout, res.stdout
        assert not os.path.exists(sock)
    finally:
        shutil.rmtree(site_dir, ignore_errors=True)
