"""One exception hierarchy for gpuhpc; the CLI maps each class to an exit code.

Exit codes: 2 = bad input (nothing was submitted, charged or written),
1 = the operation failed (Slurm, SSH, database, S3 ...).
"""
from __future__ import annotations


class GpuhpcError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message} ({self.hint})"
        return " ".join(text.split())


class UserInputError(GpuhpcError):
    """Bad input from a user: a spec, a flag, a file. Exit code 2.

    ``field`` names the offending field path (``nodes[2].gpus.mig[0]``) so the one-line
    message tells the user exactly what to fix.
    """

    exit_code = 2

    def __init__(self, message: str, *, field: str | None = None, hint: str | None = None) -> None:
        self.field = field
        full = f"{field}: {message}" if field else message
        super().__init__(full, hint=hint)


class SpecError(UserInputError):
    """A cluster/job/sweep spec failed validation."""


class SlurmError(GpuhpcError):
    """A Slurm command failed or returned something we could not parse."""

    def __init__(self, message: str, *, argv: list[str] | None = None, stderr: str = "", returncode: int | None = None) -> None:
        self.argv = argv or []
        self.stderr = stderr
        self.returncode = returncode
        detail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        super().__init__(f"{message}: {detail}" if detail else message)


class JobFailed(GpuhpcError):
    """A job ended in a state other than COMPLETED, or its Python call raised."""


class TransportError(GpuhpcError):
    """Running a command locally or over SSH failed (not the command itself)."""


class QuotaExceeded(GpuhpcError):
    """A reservation would overspend a quota. Nothing was submitted."""

    exit_code = 3


class LedgerError(GpuhpcError):
    """The ledger database is unusable (e.g. schema behind head)."""


class StagingError(GpuhpcError):
    """Copying data to or from S3 failed."""
