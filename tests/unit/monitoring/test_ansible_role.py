"""The gpuhpc_monitoring role's templates, rendered with Jinja as Ansible would: its rules are
the packaged rules (one set of rules), its scrape config lists the inventory's hosts."""
from __future__ import annotations

import json
from pathlib import Path

import jinja2
import yaml

REPO = Path(__file__).resolve().parents[3]
ROLE = REPO / "ansible" / "roles" / "gpuhpc_monitoring"


def render(name: str, **extra) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["to_json"] = json.dumps
    variables = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    variables.update(ansible_managed="managed by Ansible", **extra)
    return env.get_template(name).render(**variables)


def test_role_rules_are_the_packaged_rules():
    role = yaml.safe_load(render("gpuhpc-rules.yml.j2"))
    package = yaml.safe_load((REPO / "gpuhpc" / "monitoring" / "prometheus" / "rules.yml").read_text())
    assert role == package
    other = yaml.safe_load(render("gpuhpc-rules.yml.j2", gpuhpc_monitoring_idle_threshold_percent=10))
    alert = other["groups"][1]["rules"][0]
    assert alert["expr"].endswith("< 10") and "{{ $labels.job_id }}" in alert["annotations"]["summary"]


def test_scrape_config_from_inventory_groups():
    groups = {"all": ["ctl1", "dgx001", "dgx002"], "slurm_controller": ["ctl1", "ctl2"],
              "slurm_compute": ["dgx001", "dgx002"]}
    hostvars = {"ctl1": {"ansible_host": "10.0.0.1"}, "ctl2": {}, "dgx001": {}, "dgx002": {"ansible_host": "10.0.1.2"}}
    cfg = yaml.safe_load(render("prometheus.yml.j2", groups=groups, hostvars=hostvars))
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert [s["targets"][0] for s in jobs["node"]["static_configs"]] == ["10.0.0.1:9100", "dgx001:9100", "10.0.1.2:9100"]
    assert jobs["slurm"]["static_configs"] == [{"targets": ["10.0.0.1:9410"]}]
    assert [(s["targets"][0], s["labels"]["node"]) for s in jobs["gpu"]["static_configs"]] == \
        [("dgx001:9411", "dgx001"), ("10.0.1.2:9411", "dgx002")]
    assert jobs["gpu"]["honor_labels"] is True and cfg["rule_files"] == ["/etc/prometheus/gpuhpc-rules.yml"]
    empty = yaml.safe_load(render("prometheus.yml.j2", groups={"all": []}, hostvars={}))
    assert all(j["static_configs"] == [] for j in empty["scrape_configs"])
