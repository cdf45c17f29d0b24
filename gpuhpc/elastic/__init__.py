"""Elastic capacity on Slurm's own power saving (docs/elastic.md).

Slurm decides when a ``State=CLOUD`` node is needed and when it has idled long enough; it runs
``gpuhpc power resume|suspend|resume-fail`` (:mod:`gpuhpc.elastic.power`), which return at once
and leave the provider calls to a detached worker (:mod:`gpuhpc.elastic.worker`). A provider
(:mod:`gpuhpc.elastic.providers`: ``local`` slurmd processes, ``aws`` EC2) launches and ends
instances it tags as its own; :mod:`gpuhpc.elastic.reconcile` (``gpuhpc power reconcile``, run by a
timer) compares nodes and instances and is the only thing that ends instances no node owns.
"""
