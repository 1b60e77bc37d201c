"""A small error hierarchy. Every message names the table, column or setting and says what to do."""


class CdcError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigurationError(CdcError):
    """A setting, parameter or DAG-run conf is invalid; nothing was written."""


class SourceError(CdcError):
    """The source database cannot serve CDC as configured (wal_level, binlog format, missing table, no
    primary key...)."""

    #: True when waiting may cure it (a standby behind): the task is retried; else a task fails
    #: at once on it, as on a configuration error (hooks/task_errors.py)
    retryable = False


class SourceUnreachableError(SourceError):
    """The source's server refused or dropped the connection (stopped, restarting, failing over,
    or the network in between): nothing is wrong with the tables or the settings, and a later
    attempt (at the new primary, once the connection points there) may succeed. Never a schema
    change: no table's mirror is stopped for it (pipeline/schema_changes.py). The dialects decide
    which driver errors are this one (core stays free of drivers)."""

    retryable = True

    @classmethod
    def at(cls, server: str, detail: str = "", *, source: str | None = None) -> "SourceUnreachableError":
        """The error for ``server`` (what and where, as ``PostgreSQL at host:port``: never
        credentials) with the driver's own words ``detail``."""
        who = f"source {source!r}: " if source else ""
        said = " ".join(detail.split()).rstrip(".")
        return cls(
            f"{who}cannot connect to {server}: the server refused or dropped the connection"
            + (f" ({said})" if said else "")
            + ". If it is failing over, point the source's Airflow connection (or its DNS name) at the "
            "new primary; if it is down or restarting, wait for it. The task is retried (its retries "
            "setting); see docs/operations.md 'Failover'"
        )


class SourceBehindError(SourceError):
    """A standby or replica has not replayed far enough yet: a later attempt may find it there."""

    retryable = True


class RetentionError(SourceError):
    """The source may soon drop (or dropped) log the capture has not read: a replication slot
    near max_slot_wal_keep_size, a binlog file near its expiry."""


class SourceChangedError(SourceError):
    """The server behind a source is not the one capture read before (a failover, a restore,
    a slot that did not follow) and nothing proves its log continues the captured one (I14):
    capture stops until a resync (airflow-cdc resync) records the gap and repairs what differs."""


class TableNotFoundError(SourceError):
    """The source has no such table (or the user cannot see it)."""


class WatermarkError(CdcError):
    """A watermark is missing, duplicated or out of order in the changelog."""


class NotReadyError(WatermarkError):
    """A chunk's high watermark is not in the staged changelog yet: never emit early; wait and retry."""


class WatermarkLostError(WatermarkError):
    """A chunk's high watermark is on no server any more: capture staged the source's log past
    where it was written without it (a failover lost its transaction). Waiting cannot cure it:
    the snapshot's resume discards the chunk and reads it again."""


class ChunkStraddledFailoverError(WatermarkLostError):
    """The server behind the source changed between a chunk's watermarks (a promotion during
    its read): the chunk was discarded, and a retry of the reading task reads it again."""

    retryable = True


class StateError(CdcError):
    """Snapshot progress or a stored offset is in a state that forbids the requested step."""


class FencedError(StateError):
    """A writer was superseded (a newer attempt claimed the output, or its snapshot was
    stopped): it must not commit. Nothing of the refused commit was written."""


class SchemaChangeError(CdcError):
    """A source table changed in a way its mirror cannot follow in place (a column's type,
    the primary key): that table waits for a whole-table re-snapshot; the others go on."""
