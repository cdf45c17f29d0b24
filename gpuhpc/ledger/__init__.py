"""Cost and quota ledger (GitHub issue #4).

Cheap to import: SQLAlchemy and Alembic are imported only by the modules that need them
(:mod:`db`, :mod:`orm`, :mod:`admin`, :mod:`ingest`, :mod:`reports`, :mod:`slurm_sync`). The
submit path uses :mod:`gpuhpc.ledger.hooks`, whose quota decision (:mod:`quota`) is DB-API SQL
on the standard library's ``sqlite3`` (or ``psycopg``); jobs use :func:`gpuhpc.ledger.metrics.report`.
"""
