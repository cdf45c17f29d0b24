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
    assert jobs["gpu"]["honor_labels"] is True and cfg["rule_files"] == ["/etc/prometheus/gpuhpc-rules.yml",
                                                                   "/etc/prometheus/gpuhpc-rules-long-range.yml"]
    empty = yaml.safe_load(render("prometheus.yml.j2", groups={"all": []}, hostvars={}))
    assert all(j["static_configs"] == [] for j in empty["scrape_configs"])


def _alert(node: str, gpu: str, job: str, user: str, for_: str = "10m") -> dict:
    return {"exp_labels": {"node": node, "gpu": gpu, "job_id": job, "user": user, "severity": "warning",
                           "gpuhpc": "waste"},
            "exp_annotations": {"summary": f"job {job} ({user}) holds idle GPU {gpu} on {node}",
                                "description": f"GPU {gpu}  on {node} has been under 5% busy for {for_} "
                                               f"while job {job} holds it."}}


def test_waste_alert_fires_within_15_minutes_of_a_held_gpu_going_idle(tmp_path):
    """promtool's rule unit test on the rules the role installs (its defaults: `for: 10m`, 30 s
    scrape and evaluation): a held GPU idle from t0 fires by t0+15m (pending only at t0+9m); a
    busy GPU and an idle GPU no job holds never fire; a GPU that goes idle at 20m fires by 35m."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is needed; scripts/bootstrap.sh installs it"
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    interval = defaults["gpuhpc_monitoring_scrape_interval"]
    (tmp_path / "rules.yml").write_text(render("gpuhpc-rules.yml.j2"))
    m = 'gpuhpc_gpu_utilization_percent{node="n1",gpu="%s"}'
    held = 'gpuhpc_gpu_job_info{node="n1",gpu="%s",job_id="77",user="alice"}'
    idle_at_0 = _alert("n1", "2", "77", "alice")
    idle_at_20 = _alert("n1", "3", "77", "alice")
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": interval, "tests": [{
        "interval": interval,
        "input_series": [
            {"series": m % "2", "values": "0x200"},                  # idle from t0
            {"series": m % "0", "values": "90x200"},                 # busy throughout
            {"series": m % "5", "values": "0x200"},                  # idle, no job holds it
            {"series": m % "3", "values": "80x39 3x160"},            # busy, then idle from 20m
            *({"series": held % g, "values": "1x200"} for g in ("2", "0", "3")),     # job 77 holds 0, 2, 3
        ],
        "alert_rule_test": [
            {"eval_time": "9m", "alertname": "GpuhpcIdleGpuHeld", "exp_alerts": []},
            {"eval_time": "15m", "alertname": "GpuhpcIdleGpuHeld", "exp_alerts": [idle_at_0]},
            {"eval_time": "29m", "alertname": "GpuhpcIdleGpuHeld", "exp_alerts": [idle_at_0]},
            {"eval_time": "35m", "alertname": "GpuhpcIdleGpuHeld", "exp_alerts": [idle_at_0, idle_at_20]},
            {"eval_time": "90m", "alertname": "GpuhpcIdleGpuHeld", "exp_alerts": [idle_at_0, idle_at_20]},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    proc = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout + proc.stderr


def test_site_alerts_fire_on_their_conditions(tmp_path):
    """promtool's rule unit test on the site alerts the role installs (its defaults): a target down
    for 5m, the Slurm exporter failing for 5m, a GPU over 85 °C for 5m, NVML errors in 10m. A target
    that comes back, a 70 °C GPU and an error counter that stays put never fire."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is needed; scripts/bootstrap.sh installs it"
    (tmp_path / "rules.yml").write_text(render("gpuhpc-rules.yml.j2"))
    temp = 'gpuhpc_gpu_temperature_celsius{node="n1",gpu="%s",uuid="GPU-%s"}'
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "30s", "tests": [{
        "interval": "30s",
        "input_series": [
            {"series": 'up{job="gpu",instance="n1:9411",node="n1"}', "values": "1x4 0x40"},     # down from 2m
            {"series": 'up{job="gpu",instance="n2:9411",node="n2"}', "values": "1 0x4 1x40"},   # 2m down, back
            {"series": 'gpuhpc_slurm_scrape_ok{job="slurm",instance="c1:9410"}', "values": "0x40"},
            {"series": temp % ("0", "a"), "values": "91x40"},
            {"series": temp % ("1", "b"), "values": "70x40"},
            {"series": 'gpuhpc_gpu_exporter_errors_total{node="n1"}', "values": "0x10 3x30"},   # 3 errors at 5m
            {"series": 'gpuhpc_gpu_exporter_errors_total{node="n2"}', "values": "7x40"},
        ],
        "alert_rule_test": [
            {"eval_time": "6m", "alertname": "GpuhpcTargetDown", "exp_alerts": []},
            {"eval_time": "8m", "alertname": "GpuhpcTargetDown", "exp_alerts": [{
                "exp_labels": {"job": "gpu", "instance": "n1:9411", "node": "n1", "severity": "critical"},
                "exp_annotations": {"summary": "gpu target n1:9411 (n1) is down",
                                    "description": "Prometheus has not scraped n1:9411 (job gpu) for 5m: its "
                                                   "metrics and the alerts on them are blind."}}]},
            {"eval_time": "4m", "alertname": "GpuhpcSlurmScrapeFailing", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "GpuhpcSlurmScrapeFailing", "exp_alerts": [{
                "exp_labels": {"job": "slurm", "instance": "c1:9410", "severity": "critical"},
                "exp_annotations": {"summary": "the Slurm exporter on c1:9410 cannot ask Slurm",
                                    "description": "scontrol, squeue or sstat failed on every scrape for 5m: "
                                                   "partition, job and pending series are empty."}}]},
            {"eval_time": "6m", "alertname": "GpuhpcGpuHot", "exp_alerts": [{
                "exp_labels": {"node": "n1", "gpu": "0", "uuid": "GPU-a", "severity": "warning"},
                "exp_annotations": {"summary": "GPU 0 on n1 at 91 °C",
                                    "description": "GPU GPU-a on n1 has been over 85 °C for 5m (it throttles "
                                                   "near its slowdown temperature)."}}]},
            {"eval_time": "4m", "alertname": "GpuhpcGpuExporterErrors", "exp_alerts": []},
            {"eval_time": "6m", "alertname": "GpuhpcGpuExporterErrors", "exp_alerts": [{
                "exp_labels": {"node": "n1", "severity": "warning"},
                "exp_annotations": {"summary": "the GPU exporter on n1 had NVML errors",
                                    "description": "3 NVML calls failed in 10m on n1 (other than 'not "
                                                   "supported'): the driver or a GPU is in trouble."}}]},
            {"eval_time": "18m", "alertname": "GpuhpcGpuExporterErrors", "exp_alerts": []},
        ]}]}
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests, allow_unicode=True))
    proc = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
