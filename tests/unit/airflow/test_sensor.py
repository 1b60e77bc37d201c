"""HighWatermarkSensor: poke on real staged files, deferral to the trigger, execute_complete."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import TaskDeferred

from airflow_provider_cdc.core.errors import NotReadyError
from airflow_provider_cdc.sensors.high_watermark import HighWatermarkSensor, flatten_chunk_results
from airflow_provider_cdc.triggers.high_watermark import HighWatermarkTrigger

from .test_trigger import stage


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
