"""The site config keys the gpuhpc_login role writes (/etc/gpuhpc/config.toml): the cluster name and
the ledger database URL users' commands fall back to when GPUHPC_DB_URL is unset."""
from __future__ import annotations

import pytest

from gpuhpc import config
from gpuhpc.errors import UserInputError
from gpuhpc.ledger import hooks, paths

SITE = '[site]\ncluster_name = "dgxpod"\n[ledger]\ndb_url = "postgresql+psycopg://gpuhpc_reader@db/gpuhpc"\n' \
       '[cmdserver]\nallowed = false\n'


@pytest.fixture
def site(tmp_path, monkeypatch):
    path = tmp_path / "config.toml"
    path.write_text(SITE)
    monkeypatch.setenv("GPUHPC_SITE_CONFIG", str(path))
    monkeypatch.delenv("GPUHPC_DB_URL", raising=False)
    monkeypatch.delenv("GPUHPC_LEDGER", raising=False)
    return path


def test_site_keys_are_read(site):
    assert config.site_setting("site", "cluster_name") == "dgxpod"
    assert config.site_setting("cmdserver", "allowed") is False


def test_the_ledger_url_falls_back_to_the_site_config(site, monkeypatch):
    url = "postgresql+psycopg://gpuhpc_reader@db/gpuhpc"
    assert paths.db_url() == url
    assert hooks.ledger_in_use() == url
    monkeypatch.setenv("GPUHPC_DB_URL", "sqlite:////var/tmp/x.db")      # the environment wins
    assert paths.db_url() == "sqlite:////var/tmp/x.db"


def test_without_the_key_the_embedded_file_is_used(site):
    site.write_text("[site]\ncluster_name = \"dgxpod\"\n")
    assert paths.db_url() == f"sqlite:///{paths.default_db_path()}"


def test_the_url_belongs_in_the_site_config_only(tmp_path):
    user = tmp_path / "user.toml"
    user.write_text('[ledger]\ndb_url = "sqlite:///x"\n')
    with pytest.raises(UserInputError, match="unknown section"):
        config.read_file(str(user), "user")
