"""Work from a laptop that spans the job and sweep layers: the layer above both
:mod:`gpuhpc.jobs` and :mod:`gpuhpc.sweeps` (neither imports it).

A single Python call over SSH (``gpuhpc.submit(fn, cluster="NAME")``) is the job layer's own
(:mod:`gpuhpc.jobs.remote`); a sweep from a laptop (``gpuhpc.sweep(fn, space,
cluster="NAME")``) is made on the cluster by one command there and followed by a job:
:mod:`gpuhpc.remote.sweeps`.
"""
