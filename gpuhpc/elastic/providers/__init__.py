"""Where instances come from: :class:`~gpuhpc.elastic.providers.base.Provider` and its ``local``
and ``aws`` implementations, chosen by a pool's ``provider``."""
from __future__ import annotations

from gpuhpc.elastic.config import ElasticConfig
from gpuhpc.elastic.providers.base import Provider


def provider_for(name: str, config: ElasticConfig) -> Provider:
    if name == "local":
        from gpuhpc.elastic.providers.local import LocalProvider

        return LocalProvider(config)
    if name == "aws":
        from gpuhpc.elastic.providers.ec2 import Ec2Provider

        return Ec2Provider.from_config(config)
    raise ValueError(f"unknown provider {name!r}")
