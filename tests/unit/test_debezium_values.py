"""Debezium's value encodings at their edges (export/debezium.py), each expected value derived by
hand from Debezium's and Kafka Connect's rules: Decimal's minimal two's-complement bytes,
VariableScaleDecimal's stripped scale, ZonedTimestamp's fraction and year forms, MicroTime
past 24 hours, MicroDuration's 30.4375-day month, Bits' little-endian bytes."""

from __future__ import annotations

import base64

import pytest

from airflow_provider_cdc.core.schema import Column
from airflow_provider_cdc.export.debezium import field_schema


def b64(*octets: int) -> str:
    return base64.b64encode(bytes(octets)).decode()


def value(logical: str, source_type: str, v, connector: str = "postgresql"):
    node, conv = field_schema(Column("c", logical, source_type), connector)
    return conv(v)


@pytest.mark.parametrize(("text", "expected"), [
    ("0.00", b64(0x00)), ("1.27", b64(0x7F)), ("1.28", b64(0x00, 0x80)), ("-1.28", b64(0x80)),
    ("-1.29", b64(0xFF, 0x7F)), ("12.34", b64(0x04, 0xD2)), ("-12.34", b64(0xFB, 0x2E)),
    ("99999999.99", b64(0x02, 0x54, 0x0B, 0xE3, 0xFF)),
])
def test_decimal_is_the_unscaled_value_in_minimal_big_endian_twos_complement(text, expected):
    assert value("decimal(10,2)", "numeric(10,2)", text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("12.3400", {"scale": 2, "value": b64(0x04, 0xD2)}),
    ("100", {"scale": 0, "value": b64(0x64)}),  # 1E+2: a negative scale becomes 0
    ("-0.000", {"scale": 0, "value": b64(0x00)}),
    ("0.000000000000000000001", {"scale": 21, "value": b64(0x01)}),
    ("NaN", None),  # Debezium's precise mode fails the connector: there is no value to match
])
def test_unbounded_numeric_is_a_variable_scale_decimal(text, expected):
    assert value("decimal", "numeric", text) == expected


@pytest.mark.parametrize(("text", "precision", "expected"), [
    ("2024-01-15T10:30:00.000000Z", "timestamp with time zone", "2024-01-15T10:30:00.000000Z"),
    ("2024-01-15T10:30:00.123400Z", "timestamp(3) with time zone", "2024-01-15T10:30:00.123Z"),
    ("2024-01-15T10:30:00.500000Z", "timestamp(0) with time zone", "2024-01-15T10:30:00.5Z"),
    ("2024-01-15T10:30:00.000000Z", "timestamp(0) with time zone", "2024-01-15T10:30:00Z"),
    ("10000-01-01T00:00:00.000000Z", "timestamp with time zone", "+10000-01-01T00:00:00.000000Z"),
    ("-0043-03-15T12:00:00.000000Z", "timestamp with time zone", "-0043-03-15T12:00:00.000000Z"),
    ("infinity", "timestamp with time zone", "infinity"),
])
def test_zoned_timestamp_has_the_columns_fraction_digits_and_iso_years(text, precision, expected):
    assert value("timestamptz", precision, text) == expected


def test_time_and_interval_and_bits():
    assert value("time", "time(6)", "-838:59:59.000000", "mariadb") == -3020399000000
    assert value("time", "time without time zone", "24:00:00.000000") == 86400000000
    assert value("time", "time(3) without time zone", "13:51:30.123000") == 49890123
    # (1 year 2 months = 14 months) * 30.4375 days + 3 days, then -04:05:06 (every part negative)
    assert value("string", "interval", "1 year 2 mons 3 days -04:05:06") == int(
        ((((14 * 30.4375 + 3) * 24 - 4) * 60 - 5) * 60 - 6) * 1e6)
    assert value("string", "interval", "-1 days +02:03:00") == int((((-1 * 24 + 2) * 60 + 3) * 60) * 1e6)
    assert value("string", "bit varying(16)", "0000000100000010") == b64(0x02, 0x01)  # PostgreSQL: minimal, LE
    assert value("string", "bit varying", "000") == ""
    assert value("int64", "bit(16)", 0b0000000100000010, "mysql") == b64(0x02, 0x01)  # MySQL: padded to 2 bytes
    assert value("int64", "bit(16)", 1, "mysql") == b64(0x01, 0x00)
    assert value("uint64", "bigint(20) unsigned", 2**63, "mysql") == -(2**63)


def test_mysql_enum_options_and_zero_dates():
    node, _ = field_schema(Column("e", "string", "enum('a','it''s','b\\\\c')"), "mysql")
    assert node["parameters"] == {"allowed": "a,it's,b\\c"}
    assert value("date", "date", "0000-00-00", "mysql") is None
    assert value("timestamp", "datetime", "2020-05-00T00:00:00.000000", "mysql") is None
    assert value("timestamptz", "timestamp", "0000-00-00T00:00:00.000000Z", "mysql") is None
