"""The adaptive chunk size's settings (CDC_CHUNK_TARGET_SECONDS, CDC_CHUNK_TARGET_MB,
CDC_CHUNK_MIN_ROWS, CDC_CHUNK_MAX_ROWS) from the environment and the sources config, bad
values named; the chunk_size rule of a run's conf (a number: fixed; absent or "auto": adaptive)."""

from __future__ import annotations

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.throttle import MB, ChunkSizing
from airflow_provider_cdc.pipeline.snapshot_conf import parse_snapshot_conf


def test_settings_load_reads_the_variables_and_names_a_bad_one():
    from airflow_provider_cdc.settings import load

    assert load({}).chunk_sizing == ChunkSizing()
    s = load({"CDC_CHUNK_TARGET_SECONDS": "3", "CDC_CHUNK_TARGET_MB": "8", "CDC_CHUNK_MIN_ROWS": "10",
              "CDC_CHUNK_MAX_ROWS": "20000"}).chunk_sizing
    assert s == ChunkSizing(3.0, 8 * MB, 10, 20_000)
    with pytest.raises(ConfigurationError, match="CDC_CHUNK_MAX_ROWS"):
        load({"CDC_CHUNK_MAX_ROWS": "lots"})


def test_a_sources_config_entry_sets_them_and_a_bad_one_names_the_key():
    from airflow_provider_cdc.sources_config import parse_sources

    doc = {"sources": {"shop": {"conn_id": "shop_pg", "tables": ["public.t"], "chunk_target_seconds": 2,
                                "chunk_max_rows": 50_000, "throttle": {"chunk_size": "auto"}}}}
    (entry,) = parse_sources(doc, env={})
    assert entry.settings.chunk_sizing == ChunkSizing(target_seconds=2.0, max_rows=50_000)
    doc["sources"]["shop"]["chunk_target_mb"] = "big"
    with pytest.raises(ConfigurationError, match="key 'chunk_target_mb': CDC_CHUNK_TARGET_MB must be a number"):
        parse_sources(doc, env={})
    del doc["sources"]["shop"]["chunk_target_mb"]
    doc["sources"]["shop"]["throttle"] = {"chunk_size": "fast"}
    with pytest.raises(ConfigurationError, match="key 'throttle': throttle setting chunk_size must be a whole number"):
        parse_sources(doc, env={})


def test_a_runs_conf_fixes_the_size_or_leaves_it_adaptive():
    assert parse_snapshot_conf({"tables": ["public.t"]}).request.throttle.chunk_size is None
    fixed = parse_snapshot_conf({"tables": ["public.t"], "chunk_size": 5000})
    assert fixed.request.throttle.chunk_size == 5000 and "chunk_size" in fixed.given
    auto = parse_snapshot_conf({"tables": ["public.t"], "chunk_size": "auto"})
    assert auto.request.throttle.chunk_size is None and "chunk_size" in auto.given  # a resume goes back to adaptive
    with pytest.raises(ConfigurationError, match="chunk_size must be a whole number from 1 to 10000000 .* or 'auto'"):
        parse_snapshot_conf({"tables": ["public.t"], "chunk_size": -5})
