"""`gpuhpc cluster status` warns when preemption would not send the jobs' warning signal."""
from __future__ import annotations

from gpuhpc.cli.cluster import preempt_signal_warning


def test_warns_only_when_preemption_is_on_without_the_user_signal():
    base = {"PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE"}
    assert "preempt_send_user_signal" in preempt_signal_warning({**base, "SlurmctldParameters": "(null)"})
    assert preempt_signal_warning({**base, "SlurmctldParameters": "enable_configless,preempt_send_user_signal"}) is None
    assert preempt_signal_warning({"PreemptType": "preempt/none", "PreemptMode": "OFF"}) is None
    assert preempt_signal_warning({**base, "PreemptMode": "OFF", "SlurmctldParameters": "(null)"})  # partitions may


def test_the_rendered_slurm_conf_sends_the_user_signal_whenever_preemption_is_on():
    """What the roles install (gpuhpc conf render: the same templates) has it without the spec asking."""
    from pathlib import Path

    import yaml

    from gpuhpc.conf.render import render_spec
    from gpuhpc.spec.cluster import spec_from_data

    data = yaml.safe_load((Path(__file__).parents[3] / "examples" / "clusters" / "local.yaml").read_text())
    data["runtime"]["slurmctld_parameters"] = []
    files, _ = render_spec(spec_from_data(data))
    assert "SlurmctldParameters=preempt_send_user_signal\n" in files["slurm.conf"]
    data["preemption"] = {"type": "none", "mode": "OFF"}
    data["partitions"] = [{k: v for k, v in p.items() if k not in ("preempt_mode", "grace_time")}
                          for p in data["partitions"]]
    data["qos"] = [{k: v for k, v in q.items() if k not in ("preempt_mode", "preempt", "grace_time")}
                   for q in data["qos"]]
    files, _ = render_spec(spec_from_data(data))
    assert "preempt_send_user_signal" not in files["slurm.conf"]
