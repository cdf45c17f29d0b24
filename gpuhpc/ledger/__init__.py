"""Cost and quota ledger (GitHub issue #4).

Cheap to import: the database layer (SQLAlchemy, Alembic) is imported only by the
modules that need it (:mod:`db`, :mod:`orm`, :mod:`quota`, :mod:`ingest`, :mod:`reports`).
The submit path uses :mod:`gpuhpc.ledger.hooks`; jobs use :func:`gpuhpc.ledger.metrics.report`.
"""
