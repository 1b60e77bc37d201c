"""What ``airflow-cdc doctor`` says of a source, one finding per check: its severity, what was
checked and what is wrong and the fix (ok: what holds). Each dialect makes the findings of its
own database (``Dialect.doctor_findings``); doctor.py the ones every source shares."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR, WARNING, OK = "error", "warning", "ok"


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning | ok
    check: str  # what was checked: connection, wal_level, grants, table public.t, ...
    message: str  # what is wrong and the fix (ok: what holds)

    def line(self) -> str:
        """One line, whatever the message: a driver's multi-line text is folded."""
        return f"{self.severity.upper():<7} {self.check}: {' '.join(self.message.split())}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)
