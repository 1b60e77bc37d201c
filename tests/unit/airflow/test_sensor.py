"""HighWatermarkSensor: poke on real staged files, deferral to the trigger, execute_complete."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_cdc.core.chunk import flatten_chunk_results
from airflow_provider_cdc.core.errors import NotReadyError
from airflow_provider_cdc.sensors.high_watermark import HighWatermarkSensor
from airflow_provider_cdc.triggers.high_watermark import HighWatermarkTrigger

from .helpers import stage


def chunk(hw: str, seq: int = 0) -> dict:
    return {"high_watermark": hw, "low_watermark": "lw-" + hw, "seq": seq, "table": "public.t"}


def sensor(tmp_path, chunks, **kw) -> HighWatermarkSensor:
    return HighWatermarkSensor(
        task_id="wait",
        chunks=chunks,
        data_dir=str(tmp_path),
        source="src",
        cdc_conn_id="unused",
        drain=False,
        **kw,
    )


def test_flatten_mapped_results():
    assert flatten_chunk_results([[chunk("a")], None, [], [chunk("b"), chunk("c")]]) == [
        chunk("a"),
        chunk("b"),
        chunk("c"),
    ]
    assert flatten_chunk_results(chunk("a")) == [chunk("a")]
    with pytest.raises(TypeError, match="string"):
        flatten_chunk_results(["oops"])


def test_poke_waits_for_every_high_watermark(tmp_path):
    s = sensor(tmp_path, [[chunk("hw-1")], [chunk("hw-2")]])
    assert s.poke({}) is False
    stage(str(tmp_path), "src", "hw-1")
    assert s.poke({}) is False
    stage(str(tmp_path), "src", "hw-2", start=500)
    assert s.poke({}) is True


def test_no_chunks_means_nothing_to_wait_for(tmp_path):
    assert sensor(tmp_path, [[], []]).poke({}) is True


def test_deferrable_defers_with_the_trigger(tmp_path):
    s = sensor(tmp_path, [[chunk("hw-1")]], deferrable=True, poke_interval=2, timeout=600)
    with pytest.raises(TaskDeferred) as exc:
        s.execute({})
    trig = exc.value.trigger
    assert isinstance(trig, HighWatermarkTrigger)
    assert trig.watermark_ids == ["hw-1"] and trig.source == "src" and trig.timeout == 600
    assert exc.value.method_name == "execute_complete"


def test_deferrable_returns_at_once_when_staged(tmp_path):
    stage(str(tmp_path), "src", "hw-1")
    assert sensor(tmp_path, [[chunk("hw-1")]], deferrable=True).execute({}) is None


def test_execute_complete(tmp_path):
    s = sensor(tmp_path, [[chunk("hw-1")]], deferrable=True)
    with pytest.raises(NotReadyError, match="not staged"):
        s.execute_complete({}, {"status": "error", "message": "hw-1 not staged"})
    with pytest.raises(TaskDeferred):  # pending and still missing: defer again
        s.execute_complete({}, {"status": "pending", "missing": 1})
    stage(str(tmp_path), "src", "hw-1")
    assert s.execute_complete({}, {"status": "pending", "missing": 1}) == {"trigger_event": "pending", "watermarks": 1}
    assert s.execute_complete({}, {"status": "success"}) == {"trigger_event": "success", "watermarks": 1}


@pytest.mark.parametrize(("raw", "expected"), [("", None), ("true", True), (" Yes ", True), ("0", False), ("off", False)])
def test_deferrable_from_env(monkeypatch, raw, expected):
    from airflow_provider_cdc.sensors.high_watermark import deferrable_from_env

    monkeypatch.setenv("CDC_SENSOR_DEFERRABLE", raw)
    assert deferrable_from_env() is expected


@pytest.mark.parametrize(("raw", "expected"), [("", 5.0), ("1", 1.0), ("0.5", 0.5)])
def test_poke_interval_from_env(monkeypatch, raw, expected):
    from airflow_provider_cdc.sensors.high_watermark import poke_interval_from_env

    monkeypatch.setenv("CDC_SENSOR_POKE_INTERVAL", raw)
    assert poke_interval_from_env() == expected


@pytest.mark.parametrize(
    ("name", "raw"),
    [("CDC_SENSOR_DEFERRABLE", "maybe"), ("CDC_SENSOR_POKE_INTERVAL", "abc"), ("CDC_SENSOR_POKE_INTERVAL", "0"),
     ("CDC_SENSOR_POKE_INTERVAL", "-3"), ("CDC_SENSOR_POKE_INTERVAL", "nan")],
)
def test_bad_sensor_settings_name_the_setting(monkeypatch, name, raw):
    from airflow_provider_cdc.core.errors import ConfigurationError
    from airflow_provider_cdc.sensors.high_watermark import deferrable_from_env, poke_interval_from_env

    monkeypatch.setenv(name, raw)
    with pytest.raises(ConfigurationError, match=name):
        deferrable_from_env() if name == "CDC_SENSOR_DEFERRABLE" else poke_interval_from_env()


def test_waiting_on_a_held_capture_lock_never_fails_the_task(tmp_path, monkeypatch):
    """The DAG's sensor pokes (no reschedule: apache/airflow#71172 lost reschedule tries
    while the capture lock was held for minutes): many pokes with the lock held elsewhere
    just wait, and the task succeeds once the capture holding it has staged the watermark."""
    import runpy
    from pathlib import Path

    from airflow_provider_cdc.pipeline import capture

    dag = runpy.run_path(str(Path(__file__).resolve().parents[3] / "dags" / "cdc_snapshot.py"))["dag"]
    assert dag.get_task("wait_high_watermarks").mode == "poke"

    held = {"pokes": 0}

    def capture_elsewhere(hook, data_dir):
        held["pokes"] += 1
        if held["pokes"] == 25:  # the other capture finishes and stages the window
            stage(str(tmp_path), "src", "hw-1")
        return None  # lock held by another capture

    monkeypatch.setattr(capture, "run_capture", capture_elsewhere)
    s = HighWatermarkSensor(task_id="wait", chunks=[[chunk("hw-1")]], data_dir=str(tmp_path), source="src",
                            cdc_conn_id="unused", mode="poke", poke_interval=0.001, timeout=60)
    monkeypatch.setattr(type(s), "hook", type("H", (), {"source": "src"})())
    s.execute({"ti": None})
    assert held["pokes"] == 25


def test_a_backfill_interval_waits_for_the_previous_one():
    from types import SimpleNamespace as NS

    from airflow_provider_cdc.sensors.high_watermark import previous_run_active

    def ti(prev):
        return NS(get_previous_dagrun=lambda: prev)

    backfill, manual = NS(run_type="backfill"), NS(run_type="manual")
    running = NS(run_id="backfill__2025-01-01", state="running")
    assert previous_run_active(backfill, ti(running)) == "backfill__2025-01-01"
    assert previous_run_active(backfill, ti(NS(run_id="r", state="queued"))) == "r"
    assert previous_run_active(backfill, ti(NS(run_id="r", state="success"))) is None
    assert previous_run_active(backfill, ti(NS(run_id="r", state="failed"))) is None
    assert previous_run_active(backfill, ti(None)) is None
    assert previous_run_active(manual, ti(running)) is None  # only backfills wait
    assert previous_run_active(NS(run_type="scheduled"), ti(running)) is None


def test_a_high_watermark_a_failover_lost_fails_at_once_naming_the_chunk(tmp_path):
    """Issue 57: a chunk committed on a primary that then failed before its high watermark
    reached the standby: that watermark is on no server. Once capture has staged the log past
    where it was written, waiting cannot help; the sensor says so, and what resumes it."""
    from airflow_provider_cdc.core.errors import WatermarkLostError
    from airflow_provider_cdc.core.position import Position
    from airflow_provider_cdc.storage.layout import changelog_dir
    from airflow_provider_cdc.storage.segment_index import record_through

    lost = {**chunk("hw-2", seq=7), "high_position": Position(300, 0, 0).encode()}
    s = sensor(tmp_path, [[{**chunk("hw-1"), "high_position": Position(100, 0, 0).encode()}], [lost]])
    stage(str(tmp_path), "src", "hw-1")
    record_through(changelog_dir(str(tmp_path), "src"), Position(299, 0, 0), 1)
    assert s.poke({}) is False  # not past it yet: it may still come
    record_through(changelog_dir(str(tmp_path), "src"), Position(301, 0, 0), 2)
    with pytest.raises(WatermarkLostError, match=r"public.t chunk 7 \(high watermark hw-2\).*resume"):
        s.poke({})
    # a result without the position (written before it was recorded) is only waited for
    assert sensor(tmp_path, [[chunk("hw-1")], [chunk("hw-2")]]).poke({}) is False
    # deferred: the trigger carries the positions and ends with the same error
    d = sensor(tmp_path, [[lost]], deferrable=True)
    with pytest.raises(WatermarkLostError):
        d.execute({})
    with pytest.raises(WatermarkLostError, match="on no server"):
        d.execute_complete({}, {"status": "error", "lost": True, "message": "1 chunk(s) ... on no server any more"})
