"""`gpuhpc cluster status` warns when preemption would not send the jobs' warning signal."""
from __future__ import annotations

from gpuhpc.cli.cluster import preempt_signal_warning


def test_warns_only_when_preemption_is_on_without_the_user_signal():
    base = {"PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE"}
    assert "preempt_send_user_signal" in preempt_signal_warning({**base, "SlurmctldParameters": "(null)"})
    assert preempt_signal_warning({**base, "SlurmctldParameters": "enable_configless,preempt_send_user_signal"}) is None
    assert preempt_signal_warning({"PreemptType": "preempt/none", "PreemptMode": "OFF"}) is None
    assert preempt_signal_warning({**base, "PreemptMode": "OFF", "SlurmctldParameters": "(null)"})  # partitions may
