"""Is the mirror equal to the source (I2), and is the event log consistent (I1)?

:func:`verify_table` (``table.py``) chooses the compare: range digests computed where the data is
(``digests.py``), row digests matched by key (``keyed.py``), or row by row; all three meet in
``compare.py``, which makes the report, its examples and the repair conf.
:func:`check_event_log` (``events.py``) replays a table's events per key and reports what I1
forbids (docs/DESIGN.md, "What operators and consumers see").
"""

from ...core.ranges import ranges_by_key_order
from .compare import (
    DEFAULT_CHUNK_ROWS,
    EXAMPLES,
    PARTITION_ROWS,
    MirrorIndex,
    Mismatch,
    VerifyResult,
    compare,
    row_digest,
    source_chunks,
)
from .digests import MirrorDigests, SourceDigests, digest_problems, verify_digests
from .events import EventLogReport, check_event_log, check_event_tuples, check_events, read_event_log
from .keyed import verify_keyed
from .table import mirror_position, verify_rows, verify_table

__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "EXAMPLES",
    "PARTITION_ROWS",
    "EventLogReport",
    "MirrorDigests",
    "MirrorIndex",
    "Mismatch",
    "SourceDigests",
    "VerifyResult",
    "check_event_log",
    "check_event_tuples",
    "check_events",
    "compare",
    "digest_problems",
    "mirror_position",
    "ranges_by_key_order",
    "read_event_log",
    "row_digest",
    "source_chunks",
    "verify_digests",
    "verify_keyed",
    "verify_rows",
    "verify_table",
]
