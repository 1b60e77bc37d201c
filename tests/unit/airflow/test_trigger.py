"""HighWatermarkTrigger: serialize() round-trip and the events run() yields on real staged files."""

from __future__ import annotations

import asyncio
import importlib

import pytest

from airflow_provider_cdc.triggers.high_watermark import (
    HighWatermarkTrigger,
    missing_watermarks,
)

from .helpers import stage


def first_event(trigger: HighWatermarkTrigger) -> dict:
    async def go():
        gen = trigger.run()
        ev = await gen.__anext__()
        await gen.aclose()
        return ev.payload

    return asyncio.run(asyncio.wait_for(go(), timeout=30))


def test_serialize_round_trip(tmp_path):
    t = HighWatermarkTrigger(
        data_dir=str(tmp_path),
        source="src",
        watermark_ids=["a", "b"],
        poll_interval=0.5,
        recheck_after=3,
        timeout=60,
    )
    classpath, kwargs = t.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert cls is HighWatermarkTrigger
    again = cls(**kwargs)
    assert again.serialize() == (classpath, kwargs)
    import json

    assert json.loads(json.dumps(kwargs)) == kwargs  # JSON-safe, as the triggerer stores it


def test_success_when_every_high_watermark_is_staged(tmp_path):
    d = str(tmp_path)
    stage(d, "src", "lw-1", "hw-1")
    stage(d, "src", "hw-2", start=200)
    assert missing_watermarks(d, "src", ["lw-1", "hw-1", "hw-2", "hw-3"]) == ["hw-3"]
    ev = first_event(
        HighWatermarkTrigger(data_dir=d, source="src", watermark_ids=["hw-1", "hw-2"], poll_interval=0.01)
    )
    assert ev["status"] == "success"


def test_pending_hands_back_to_the_sensor_to_drain(tmp_path):
    d = str(tmp_path)
    stage(d, "src", "hw-1")
    assert missing_watermarks(d, "src", ["hw-1", "hw-9"]) == ["hw-9"]
    ev = first_event(
        HighWatermarkTrigger(
            data_dir=d, source="src", watermark_ids=["hw-1", "hw-9"], poll_interval=0.01, recheck_after=0.05
        )
    )
    assert ev == {"status": "pending", "missing": 1}


def test_timeout_is_an_error_that_says_what_to_check(tmp_path):
    ev = first_event(
        HighWatermarkTrigger(
            data_dir=str(tmp_path), source="src", watermark_ids=["hw-x"], poll_interval=0.01, timeout=0.05
        )
    )
    assert ev["status"] == "error"
    assert "hw-x" in ev["message"] and "cdc_changelog" in ev["message"]


def test_unreadable_segment_is_an_error_event(tmp_path):
    d = str(tmp_path)
    stage(d, "src", "hw-1")
    seg = next((tmp_path / "staging" / "src" / "changelog").glob("seg-*.parquet"))
    seg.write_bytes(b"not parquet")
    ev = first_event(
        HighWatermarkTrigger(data_dir=d, source="src", watermark_ids=["hw-1"], poll_interval=0.01)
    )
    assert ev["status"] == "error" and "src" in ev["message"]


@pytest.mark.parametrize("ids", [[], [None, ""]])
def test_nothing_to_wait_for(tmp_path, ids):
    assert missing_watermarks(str(tmp_path), "src", ids) == []


def test_a_lost_high_watermark_ends_the_wait_with_an_error_at_once(tmp_path):
    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.segment_index import record_through

    stage(str(tmp_path), "src", "hw-1")
    record_through(changelog_dir(str(tmp_path), "src"), Position(400, 0, 0), 1)
    t = HighWatermarkTrigger(data_dir=str(tmp_path), source="src", watermark_ids=["hw-1", "hw-2"],
                             poll_interval=0.05, high_positions={"hw-2": Position(300, 0, 0).encode()})
    classpath, kwargs = t.serialize()
    assert kwargs["high_positions"] == {"hw-2": Position(300, 0, 0).encode()}
    ev = first_event(HighWatermarkTrigger(**kwargs))
    assert ev["status"] == "error" and ev["lost"] is True and "hw-2" in ev["message"] and "resume" in ev["message"]
    # past nothing it was written at: pending as before
    late = HighWatermarkTrigger(data_dir=str(tmp_path), source="src", watermark_ids=["hw-2"], poll_interval=0.05,
                                recheck_after=0, high_positions={"hw-2": Position(500, 0, 0).encode()})
    assert first_event(late)["status"] == "pending"
