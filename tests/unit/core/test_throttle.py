"""Throttle settings: validation and changes between rounds."""

import pytest

from airflow_provider_cdc.core.errors import ConfigurationError
from airflow_provider_cdc.core.throttle import Throttle


def test_defaults_round_trip_and_merge():
    t = Throttle()
    assert Throttle.from_dict(t.to_dict()) == t == Throttle.from_dict(None)
    slower = t.merge({"chunk_size": 500, "delay_seconds": 2, "parallelism": None})
    assert slower == Throttle(500, 2.0, 1) and isinstance(slower.delay_seconds, float)
    assert slower.merge({"parallelism": 4}) == Throttle(500, 2.0, 4)
    assert t.merge({}) is t


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"chunk_size": 0}, "chunk_size must be a whole number from 1"),
        ({"chunk_size": 2.5}, "chunk_size must be a whole number"),
        ({"parallelism": 10_000}, "parallelism must be a whole number from 1 to 256"),
        ({"delay_seconds": -1}, "delay_seconds must be a number of seconds from 0"),
        ({"delay_seconds": "1"}, "delay_seconds must be a number"),
        ({"chunk_size": True}, "chunk_size"),
        ({"chunksize": 5}, r"unknown throttle setting\(s\) \['chunksize'\]"),
    ],
)
def test_invalid_settings_name_the_setting(conf, message):
    with pytest.raises(ConfigurationError, match=message):
        Throttle.from_dict(conf)
    with pytest.raises(ConfigurationError, match=message):
        Throttle(100, 1.0, 2).merge(conf)
