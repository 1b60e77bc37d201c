"""Why PostgreSQL invalidated a slot, in capture's error: 17+ names the reason (18 adds
idle_replication_slot_timeout's), older servers invalidate a logical slot only for its WAL."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.dialects.postgres.log_reader import _invalidation_reason, slot_invalidated_why

# what PostgreSQL 18.6 answers to a read of a slot idle_replication_slot_timeout invalidated
PG18_IDLE = ('ERROR:  can no longer access replication slot "cdc_idle"\n'
             'DETAIL:  This replication slot has been invalidated due to "idle_timeout".')


def test_the_reason_a_read_of_the_slot_reports_is_named():
    assert _invalidation_reason(PG18_IDLE) == "idle_timeout"
    why = slot_invalidated_why(_invalidation_reason(PG18_IDLE))
    assert "idle_replication_slot_timeout" in why and "run the capture more often" in why


@pytest.mark.parametrize(("reason", "words"), [
    (None, "max_slot_wal_keep_size"),  # before 17: the WAL, the only reason for a logical slot
    ("wal_removed", "max_slot_wal_keep_size"),
    ("rows_removed", "vacuumed"),
    ("wal_level_insufficient", "wal_level"),
    ("something_newer", "'something_newer'"),
])
def test_each_reason_says_what_happened(reason, words):
    assert slot_invalidated_why(reason).startswith("was invalidated (") and words in slot_invalidated_why(reason)


def test_a_message_without_a_reason_gives_none():
    assert _invalidation_reason('ERROR:  requested WAL segment 000000010000000000000001 has already been removed') is None
