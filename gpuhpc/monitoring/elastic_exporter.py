"""Elastic capacity exporter: :mod:`gpuhpc.elastic.metrics` (node transitions, resume failures,
reclaims, pool state) from the instance journal and power records on the controller; no Slurm
command per scrape.

    python -m gpuhpc.monitoring.elastic_exporter --port 9420 [--addr 127.0.0.1] [--config PATH]
"""
from __future__ import annotations

import argparse
import sys
import time

from gpuhpc.elastic import journal
from gpuhpc.elastic.config import ElasticConfig, load_config
from gpuhpc.elastic.metrics import METRICS, samples
from gpuhpc.elastic.store import Store


class ElasticCollector:
    """prometheus_client custom collector over the journal and records of ``config``."""

    def __init__(self, config: ElasticConfig) -> None:
        self.config = config

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        data = samples(self.config, journal.read(self.config.state_dir), Store(self.config.state_dir).read(), time.time())
        fams = {}
        for name, (kind, help_, labels) in METRICS.items():
            if kind == "counter":
                fams[name] = CounterMetricFamily(name.removesuffix("_total"), help_, labels=list(labels))
            else:
                fams[name] = GaugeMetricFamily(name, help_, labels=list(labels))
        for name, labels, value in data:
            fams[name].add_metric(list(labels), value)
        yield from fams.values()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gpuhpc.monitoring.elastic_exporter")
    ap.add_argument("--port", type=int, default=9420)
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--config", default=None,
                    help="the elastic config (default: $GPUHPC_ELASTIC_CONFIG, /etc/gpuhpc/elastic.json)")
    args = ap.parse_args(argv)
    from gpuhpc.monitoring import serve

    serve(ElasticCollector(load_config(args.config)), port=args.port, addr=args.addr, what="elastic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
