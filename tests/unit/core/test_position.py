"""Position contract: encode order == tuple order, PostgreSQL LSNs, binlog names."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_cdc.core.position import (
    ENCODED_LENGTH,
    ZERO,
    Position,
    binlog_file_index,
    int_to_lsn,
    lsn_to_int,
)

from .hyp import cases

U64 = st.integers(0, 2**64 - 1)
positions = st.builds(Position, U64, U64, st.integers(0, 2**32 - 1))


@cases(scale=0.3)
@given(positions, positions)
def test_encoded_order_is_position_order(a, b):
    ea, eb = a.encode(), b.encode()
    assert len(ea) == ENCODED_LENGTH and ea == ea.lower()
    assert (ea < eb) == (a < b) and (ea == eb) == (a == b)
    assert (a < b) == ((a.major, a.minor, a.index) < (b.major, b.minor, b.index))
    assert Position.decode(ea) == a and a.is_after(b) == (a > b)


def test_bounds_and_decode_errors():
    assert ZERO.encode() == "0" * 40
    assert Position(2**64 - 1, 2**64 - 1, 2**32 - 1).encode() == "f" * 40
    for bad in ((-1, 0, 0), (2**64, 0, 0), (0, 0, 2**32)):
        with pytest.raises(ValueError, match="position out of range"):
            Position(*bad)
    with pytest.raises(ValueError, match="want 40 hex digits"):
        Position.decode("abc")


def test_postgres_lsn():
    assert lsn_to_int("16/B374D848") == (0x16 << 32) | 0xB374D848
    assert int_to_lsn(lsn_to_int("0/0")) == "0/0" and int_to_lsn((0x16 << 32) | 0xB374D848) == "16/B374D848"
    assert Position.pg("1/10", 3) == Position((1 << 32) | 0x10, 0, 3)
    assert Position.pg("0/FF") < Position.pg("1/0")  # numeric, not string, order
    assert Position.pg(5, 1) > Position.pg(5, 0)
    for bad in ("16B374D848", "x/1", None):
        with pytest.raises(ValueError, match="not a PostgreSQL LSN"):
            lsn_to_int(bad)


@cases(scale=0.1)
@given(st.integers(0, 2**64 - 1))
def test_lsn_text_round_trip(n):
    assert lsn_to_int(int_to_lsn(n)) == n


def test_binlog_positions():
    assert binlog_file_index("binlog.000042") == 42 and binlog_file_index("mysql-bin.1000000") == 1000000
    assert Position.binlog("binlog.000009", 4000, 2) < Position.binlog("binlog.000010", 4, 0)
    assert Position.binlog(3, 100, 1) == Position(3, 100, 1)
    with pytest.raises(ValueError, match="not a binlog file name"):
        binlog_file_index("binlog")
    assert str(Position(255, 16, 3)) == "FF/10/3"


def test_a_wal_record_end_on_a_page_boundary_is_taken_as_the_next_records_start():
    """PostgreSQL's insert position at a page boundary lies past the page header; flush and
    replay positions do not. Taken as starts, an idle server's own insert position is reached."""
    from airflow_provider_cdc.core.position import next_record_start

    block, seg = 8192, 16 << 20
    assert next_record_start(8192 * 3 + 48, block, seg) == 8192 * 3 + 48  # inside a page: itself
    assert next_record_start(8192 * 3, block, seg) == 8192 * 3 + 24  # a page's short header
    assert next_record_start(seg * 2, block, seg) == seg * 2 + 40  # a segment's long header


def test_a_standby_chunk_lands_after_the_record_whose_redo_may_be_done():
    """Replay moves past a record only after its redo: with WAL received beyond the replay
    position, the commit that starts there may already be visible to the chunk, so its events
    must sort before the chunk's rows; with nothing beyond, the mark is the insert position's."""
    from airflow_provider_cdc.core.position import just_before, standby_mark

    block, seg = 8192, 16 << 20
    h = 8192 * 5 + 200
    commit = Position.pg(h, 0)  # the events of a commit record starting at the replay position
    assert standby_mark(h, h + 120, block, seg) > Position.pg(h, 7) > commit
    assert standby_mark(h, None, block, seg) > commit  # not known: as if received
    assert standby_mark(h, h, block, seg) == just_before(commit) < commit  # fully replayed
    assert standby_mark(8192 * 6, 8192 * 6 + 500, block, seg) > Position.pg(8192 * 6 + 24)  # past a page header
