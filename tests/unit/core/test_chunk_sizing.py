"""The adaptive chunk size (core/throttle.py ChunkSizer): pure, fed with the measured rows,
seconds and bytes of each chunk (no clock). Targets, the growth cap, the bounds, the bytes
target below min_rows, the fixed size, resume from a size, and bad settings named."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.throttle import (
    DEFAULT_START_ROWS,
    MAX_GROWTH,
    MB,
    ChunkSizer,
    ChunkSizing,
    Throttle,
    chunk_size_value,
    size_text,
)

SIZING = ChunkSizing(target_seconds=1.0, target_bytes=10 * MB, min_rows=100, max_rows=1_000_000)


def run(sizer: ChunkSizer, seconds_per_row: float, bytes_per_row: float, chunks: int) -> list[tuple[int, str]]:
    """Read ``chunks`` chunks of a table whose rows cost that much; the sizes asked and why."""
    out = []
    for _ in range(chunks):
        rows = sizer.size
        sizer.observe(rows, rows * seconds_per_row, int(rows * bytes_per_row))
        out.append((sizer.size, sizer.reason))
    return out


def test_starts_from_the_default_and_grows_at_most_2x_a_step_to_the_duration_target():
    s = ChunkSizer(SIZING)
    assert (s.size, s.reason, s.adaptive) == (DEFAULT_START_ROWS, "start", True)
    # 10 us a row, 10 bytes a row: 100,000 rows take the target second (bytes: 1M rows)
    sizes = run(s, 1e-5, 10, 4)
    assert sizes == [(20_000, "growth cap"), (40_000, "growth cap"), (80_000, "growth cap"), (100_000, "duration")]
    assert run(s, 1e-5, 10, 2) == [(100_000, "duration")] * 2  # steady at the target


def test_a_slower_region_shrinks_chunks_within_a_few_steps_and_a_wider_one_at_once():
    s = ChunkSizer(SIZING, start=100_000)
    assert run(s, 1e-5, 10, 1) == [(100_000, "duration")]
    # rows 10x slower: 60% of the way at once (the chunk after took 1.6x the target), then on
    # (one slow chunk on a busy machine does not shrink the next one 10x)
    assert run(s, 1e-4, 10, 3) == [(15_625, "duration"), (11_682, "duration"), (10_611, "duration")]
    # then 100x wider (10 KB a row): bytes that rise apply at once: the bytes target (10 MB)
    assert run(s, 1e-4, 10_240, 1) == [(1024, "bytes")]


def test_a_cheaper_region_grows_back_at_most_2x_a_step():
    s = ChunkSizer(SIZING, start=1_000)
    s.observe(1_000, 1.0, 1_000)  # 1 ms a row: 1,000 rows a second
    assert (s.size, s.reason) == (1_000, "duration")
    s.observe(1_000, 0.01, 1_000)  # one chunk 100x faster: the estimate moves 60% of the way: 2.5x
    assert (s.size, s.reason) == (2_000, "growth cap")
    s.observe(2_000, 0.02, 2_000)
    assert (s.size, s.reason) == (4_000, "growth cap")
    for _ in range(8):
        s.observe(s.size, s.size * 1e-5, s.size)
    assert 90_000 <= s.size <= 100_000 and s.reason == "duration"  # near the new cost in a few steps


def test_bounds_of_the_duration_and_the_bytes_target_below_min_rows():
    s = ChunkSizer(SIZING, start=1_000)
    s.observe(1_000, 100.0, 1_000)  # 0.1 s a row: 10 rows would take the target
    assert (s.size, s.reason) == (100, "min rows")
    s = ChunkSizer(SIZING, start=1_000_000)
    s.observe(1_000_000, 0.001, 1_000)  # nothing costs anything: the max bound
    assert (s.size, s.reason) == (1_000_000, "max rows")
    s = ChunkSizer(SIZING, start=1_000)
    s.observe(1_000, 0.01, 1_000 * 4 * MB)  # 4 MB rows: the bytes target wins over min_rows
    assert (s.size, s.reason) == (2, "bytes")
    s.observe(2, 0.01, 2 * 64 * MB)  # a row above the whole target: still one row, never zero
    assert (s.size, s.reason) == (1, "bytes")


def test_the_bytes_target_is_capped_by_the_sources_batch_bytes():
    s = ChunkSizer(SIZING, start=1_000, target_bytes_cap=MB)  # batch_max_bytes 1 MB < 10 MB target
    assert s.target_bytes == MB
    s.observe(1_000, 0.001, 1_000 * 1024)
    assert (s.size, s.reason) == (1024, "bytes")
    assert s.describe() == "1,024 rows (bytes target 1 MB)"
    assert (size_text(32 * 1024), size_text(1.5 * MB), size_text(100)) == ("32 KB", "1.5 MB", "100 B")


def test_unknown_bytes_and_zero_durations_and_empty_chunks():
    s = ChunkSizer(SIZING, start=1_000)
    s.observe(1_000, 0.0, None)  # no cost measured at all: only the growth cap holds it
    assert (s.size, s.reason) == (1_000 * MAX_GROWTH, "growth cap")
    before = (s.size, s.reason)
    s.observe(0, 5.0, 0)  # an empty chunk teaches nothing
    assert (s.size, s.reason) == before


def test_a_fixed_size_never_changes_and_resume_starts_from_the_last_size_within_the_bounds():
    s = ChunkSizer(SIZING, fixed=5_000_000)  # explicit: above max_rows is allowed
    assert (s.size, s.reason, s.adaptive) == (5_000_000, "fixed", False)
    assert run(s, 1.0, 1e6, 2) == [(5_000_000, "fixed")] * 2
    assert s.describe() == "5,000,000 rows (fixed chunk_size)"
    assert ChunkSizer(SIZING, start=7).size == 100  # a resume from a tiny last chunk: min_rows
    assert ChunkSizer(SIZING, start=30_000).size == 30_000
    assert ChunkSizer(SIZING, start=10**9).size == 1_000_000


def test_describe_names_the_reason():
    s = ChunkSizer(SIZING, start=1_000)
    assert s.describe() == "1,000 rows (start)"
    s.observe(1_000, 1.0, 1_000)
    assert s.describe() == "1,000 rows (duration target 1 s)"
    s.observe(1_000, 100.0, 1_000)
    assert s.describe() == "100 rows (bound CDC_CHUNK_MIN_ROWS=100)"


def test_chunk_size_values_fixed_auto_and_bad():
    assert chunk_size_value(None) is None and chunk_size_value("auto") is None and chunk_size_value(" AUTO ") is None
    assert chunk_size_value(500) == 500
    for bad in (0, -1, 2.5, "100", True, 10_000_001, [1]):
        with pytest.raises(ConfigurationError, match="chunk_size must be a whole number from 1 to 10000000 .* or 'auto'"):
            chunk_size_value(bad)
    assert Throttle().chunk_size is None and Throttle(chunk_size="auto").chunk_size is None
    assert Throttle.from_dict({"chunk_size": 700}).chunk_size == 700


def test_settings_parse_defaults_and_values():
    assert ChunkSizing.parse({}) == ChunkSizing() == ChunkSizing.parse({"target_seconds": "", "max_rows": None})
    s = ChunkSizing.parse({"target_seconds": "2.5", "target_mb": "0.5", "min_rows": "1", "max_rows": "5000"})
    assert s == ChunkSizing(2.5, MB // 2, 1, 5000)


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        ({"target_seconds": "soon"}, "CDC_CHUNK_TARGET_SECONDS must be a number, got 'soon'"),
        ({"target_seconds": "0"}, "CDC_CHUNK_TARGET_SECONDS must be a number of seconds from 0.01 to 3600"),
        ({"target_seconds": "nan"}, "CDC_CHUNK_TARGET_SECONDS must be a number of seconds"),
        ({"target_mb": "-1"}, "CDC_CHUNK_TARGET_MB must be a number of megabytes > 0"),
        ({"target_mb": "inf"}, "CDC_CHUNK_TARGET_MB must be a number of megabytes > 0"),
        ({"target_mb": "0.0001"}, "CDC_CHUNK_TARGET_MB must be a number of megabytes from 0.001"),
        ({"min_rows": "0"}, "CDC_CHUNK_MIN_ROWS must be a whole number of rows from 1"),
        ({"max_rows": "1.5"}, "CDC_CHUNK_MAX_ROWS must be a number, got '1.5'"),
        ({"min_rows": "5000", "max_rows": "100"}, r"CDC_CHUNK_MIN_ROWS \(5000\) must not exceed CDC_CHUNK_MAX_ROWS"),
        ({"target": "1"}, "unknown chunk sizing setting"),
    ],
)
def test_bad_settings_name_the_variable(texts, message):
    with pytest.raises(ConfigurationError, match=message):
        ChunkSizing.parse(texts)



def test_a_probe_sizes_the_first_chunk_from_its_costs_without_the_growth_cap():
    s = ChunkSizer(SIZING)
    # 2,000 rows in 20 ms (10 us a row), 10 bytes a row: the duration target's 100,000 rows at
    # once, not 10,000 growing 2x a step
    assert s.probe(2_000, 0.02, 20_000) == 100_000 and s.reason == "duration"
    assert run(s, 1e-5, 10, 1) == [(100_000, "duration")]  # the chunks that follow keep it
    # the bounds and the bytes target hold for a probe too
    assert ChunkSizer(SIZING).probe(2_000, 0.0002, 20_000) == SIZING.max_rows
    wide = ChunkSizer(SIZING)
    assert (wide.probe(2_000, 0.02, 2_000 * 10_240), wide.reason) == (1_024, "bytes")
    # a fixed size ignores it; an empty probe changes nothing
    assert ChunkSizer(SIZING, fixed=500).probe(2_000, 0.02, 20_000) == 500
    empty = ChunkSizer(SIZING)
    assert (empty.probe(0, 0.0, 0), empty.reason) == (DEFAULT_START_ROWS, "start")


def test_rows_that_become_narrower_apply_their_duration_at_once_a_cheaper_moment_does_not():
    wide = ChunkSizer(SIZING, start=1_000)
    wide.observe(1_000, 0.1, 1_000 * 10_240)  # 100 us and 10 KB a row
    assert (wide.size, wide.reason) == (1_024, "bytes")
    # rows 100x narrower and 10x cheaper: a property of the data, the next chunk is sized for it
    # (within the 2x growth cap), not 60% of the way to it
    wide.observe(1_024, 1_024 * 1e-5, 1_024 * 100)
    assert (wide.size, wide.reason) == (2_048, "growth cap")
    wide.observe(2_048, 2_048 * 1e-5, 2_048 * 100)
    assert (wide.size, wide.reason) == (4_096, "growth cap")
    # the same rows, one chunk 10x faster (a cached page): the estimate moves 60% of the way
    same = ChunkSizer(SIZING, start=1_000)
    same.observe(1_000, 0.1, 1_000 * 100)
    same.observe(1_000, 0.01, 1_000 * 100)
    assert same._seconds_per_row == pytest.approx(1e-4 + 0.6 * (1e-5 - 1e-4))
    assert wide._seconds_per_row == pytest.approx(1e-5)
