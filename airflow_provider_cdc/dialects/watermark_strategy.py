"""How a chunk's window is bounded (docs/DESIGN.md, "Watermarks without writes"): one object per
strategy, chosen once per dialect from the connection extra ``watermark_strategy``.

* ``table`` (the default, DBLog): a watermark row written before and after each chunk SELECT;
* ``log``: nothing written; the position of the snapshot the chunk SELECT read bounds the
  window on both sides.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ..core.errors import WatermarkError
from ..core.position import position_mark
from ..core.schema import TableName


class WatermarkStrategy(ABC):
    """Opens and closes a chunk's window on ``dialect``, and says what that needs of the source."""

    name: ClassVar[str]
    #: a chunk read must report the log position its snapshot saw (it bounds the window)
    reads_snapshot_position: ClassVar[bool] = False
    #: it writes rows on the source (a standby or a replica cannot take them)
    writes_rows: ClassVar[bool] = False

    def __init__(self, dialect: Any) -> None:
        self.dialect = dialect  # the dialects.base.Dialect that chose it (not imported: base imports this)

    @abstractmethod
    def prepare(self) -> None:
        """What the strategy needs before a snapshot starts."""

    @abstractmethod
    def mark(self, watermark_id: str) -> str:
        """A point in the log that everything committed before it precedes; the id to look it up
        by in the staged changelog."""

    @abstractmethod
    def tables(self) -> list[TableName]:
        """The tables the strategy writes (the user needs their grants; a standby refuses them)."""

    @abstractmethod
    def open(self, low: str) -> None:
        """Before the chunk SELECT (DBLog step 1)."""

    @abstractmethod
    def close(self, low: str, high: str, read: Any, table: TableName) -> tuple[str, str]:
        """After the chunk SELECT, whose ChunkReadResult is ``read`` (step 3): the window's
        (low, high) watermark ids as the merge finds them in the changelog."""



class TableWatermarks(WatermarkStrategy):
    """DBLog's watermark rows: one UPDATE of the watermark table before and one after each chunk."""

    name = "table"
    writes_rows = True

    def prepare(self) -> None:
        self.dialect.ensure_watermark_table()

    def mark(self, watermark_id: str) -> str:
        self.dialect.write_watermark(watermark_id)
        return watermark_id

    def tables(self) -> list[TableName]:
        return [self.dialect.watermark_table]

    def open(self, low: str) -> None:
        self.dialect.write_watermark(low)

    def close(self, low: str, high: str, read: Any, table: TableName) -> tuple[str, str]:
        self.dialect.write_watermark(high)
        return low, high



class LogWatermarks(WatermarkStrategy):
    """Read-only: log positions instead of rows (a replica, a read-only user)."""

    name = "log"
    reads_snapshot_position = True

    def prepare(self) -> None:
        return None

    def mark(self, watermark_id: str) -> str:
        return position_mark(self.dialect.mark_position(), int(time.time() * 1000))

    def tables(self) -> list[TableName]:
        return []

    def open(self, low: str) -> None:
        return None

    def close(self, low: str, high: str, read: Any, table: TableName) -> tuple[str, str]:
        if read.snapshot_mark is None:
            raise WatermarkError(
                f"{self.dialect.source}: the chunk read of {table} reported no snapshot position "
                "(watermark strategy 'log')"
            )
        return read.snapshot_mark, read.snapshot_mark



#: the strategies by their ``watermark_strategy`` name
STRATEGIES: dict[str, type[WatermarkStrategy]] = {s.name: s for s in (TableWatermarks, LogWatermarks)}
WATERMARK_STRATEGIES = tuple(STRATEGIES)
