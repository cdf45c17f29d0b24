"""Profiling sprints: a canonical job across batch size, GPUs per node, nodes and placement,
run as a sweep; throughput, utilisation, $/throughput, scaling and a recommendation
(docs/sprints.md). ``gpuhpc.sprint`` is :func:`gpuhpc.sprints.run.sprint`."""
