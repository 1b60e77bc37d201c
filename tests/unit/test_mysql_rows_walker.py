"""The compiled rows walker (dialects/mysql/_rows.c) on hand-built row images: the binlog's
encodings written out byte by byte, the canonical values and keys they must give, and the
typed batch rows_walker builds from them against the staging's own typing of those values."""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from airflow_provider_cdc.core import arrow_types as at
from airflow_provider_cdc.core.schema import TableName
from airflow_provider_cdc.dialects.mysql import rows_walker as rw

pytestmark = pytest.mark.skipif(not rw.available(), reason="the compiled rows walker is not built")
_rows = rw._rows

INT8 = (rw.K_INT, 8, 0, 0, None)
UINT8 = (rw.K_INT, 8, 1, 0, None)
VARCHAR = (rw.K_STR, 1, 0, 0, None)
BINARY4 = (rw.K_STR, 1, 4, 1, None)  # BINARY(4): padded to 4 bytes, keyed as base64


def _str(b: bytes, lb: int = 1) -> bytes:
    return len(b).to_bytes(lb, "little") + b


def _columns(out):
    images, ops, before, after, kdata, klens, cols = out
    lens = struct.unpack(f"<{len(ops)}i", klens)
    keys, at_ = [], 0
    for n in lens:
        keys.append(kdata[at_:at_ + n].decode())
        at_ += n
    return images, list(ops), list(struct.unpack(f"<{len(ops)}i", before)), list(struct.unpack(f"<{len(ops)}i", after)), keys, cols


def test_write_rows_ints_strings_padding_and_json_keys():
    # (id BIGINT, u BIGINT UNSIGNED, s VARCHAR, b BINARY(4)), key (s, b): three rows, one with NULLs
    rows = [
        b"\x00" + struct.pack("<q", -5) + struct.pack("<Q", 2**64 - 1) + _str('q"\\\x01\n😀'.encode()) + _str(b"\x01"),
        b"\x00" + struct.pack("<q", 2**63 - 1) + struct.pack("<Q", 0) + _str(b"") + _str(b"\x00\x00\x00\x00"),
        b"\x03" + _str(b"x") + _str(b"ab"),  # id, u NULL
    ]
    data = b"junk" + b"".join(rows) + b"crc!"
    images, ops, before, after, keys, cols = _columns(
        _rows.decode(data, 4, len(data) - 4, 0, (INT8, UINT8, VARCHAR, BINARY4), (2, 3)))
    assert images == 3 and ops == [0, 0, 0] and before == [-1, -1, -1] and after == [0, 1, 2]
    assert keys == ['["q\\"\\\\\\u0001\\n😀","AQAAAA=="]', '["","AAAAAA=="]', '["x","YWIAAA=="]']
    valid, ints, lens = cols[0]
    assert valid == b"\x01\x01\x00" and struct.unpack("<3q", ints)[:2] == (-5, 2**63 - 1) and lens is None
    assert struct.unpack("<3Q", cols[1][1])[0] == 2**64 - 1
    assert cols[3][1] == b"\x01\0\0\0" + b"\0" * 4 + b"ab\0\0" and struct.unpack("<3i", cols[3][2]) == (4, 4, 4)


def test_update_rows_key_change_is_a_delete_then_a_create():
    img = lambda k, v: b"\x00" + struct.pack("<q", k) + struct.pack("<q", v)  # noqa: E731
    data = img(1, 10) + img(1, 11) + img(2, 20) + img(3, 20)
    images, ops, before, after, keys, _ = _columns(_rows.decode(data, 0, len(data), 1, (INT8, INT8), (0,)))
    assert images == 4
    assert ops == [1, 2, 0] and before == [0, 2, -1] and after == [1, -1, 3] and keys == ["[1]", "[2]", "[3]"]


def test_a_truncated_or_unknown_image_is_refused_not_misread():
    good = b"\x00" + struct.pack("<q", 1) + _str(b"abc")
    for cut in range(1, len(good)):
        with pytest.raises(ValueError, match="past the end"):
            _rows.decode(good[:cut], 0, cut, 0, (INT8, VARCHAR), (0,))
    with pytest.raises(ValueError, match="ENUM index"):
        _rows.decode(b"\x00\x05", 0, 2, 0, ((rw.K_ENUM, 1, 0, 0, (b"", b"a")),), (0,))
    with pytest.raises(ValueError, match="FLOAT or DOUBLE key"):
        _rows.decode(b"\x00" + b"\0" * 8, 0, 9, 0, ((rw.K_DOUBLE, 0, 0, 0, None),), (0,))


# hand-encoded values of the binlog's formats -> canonical text
TEXT_CASES = [
    # DECIMAL(14,2): 3 + 9 integer digits (2 + 4 bytes), 2 fraction digits (1 byte); negative = inverted
    ((rw.K_DECIMAL, 14, 2, 0, None), bytes([0x80, 0, 0, 0, 0x04, 0xD2, 0x38]), "1234.56"),
    ((rw.K_DECIMAL, 14, 2, 0, None), bytes([0x7F, 0xFF, 0xFF, 0xFF, 0xFB, 0x2D, 0xC7]), "-1234.56"),
    ((rw.K_DECIMAL, 2, 2, 0, None), bytes([0x80 | 5]), "0.05"),
    ((rw.K_DECIMAL, 10, 0, 0, None), bytes([0x80, 0, 0, 0, 0]), "0"),
    # DATE: day | month << 5 | year << 9, little-endian; zero and partial dates keep their text
    ((rw.K_DATE, 0, 0, 0, None), (29 | 2 << 5 | 2024 << 9).to_bytes(3, "little"), "2024-02-29"),
    ((rw.K_DATE, 0, 0, 0, None), (0 | 5 << 5 | 2020 << 9).to_bytes(3, "little"), "2020-05-00"),
    ((rw.K_DATE, 0, 0, 0, None), b"\0\0\0", "0000-00-00"),
    # DATETIME2(6): sign, year*13+month, day, hour, minute, second (40 bits), then 3 bytes of fraction
    ((rw.K_DATETIME2, 6, 0, 0, None),
     ((1 << 39) | ((2024 * 13 + 1) << 22) | (2 << 17) | (3 << 12) | (4 << 6) | 5).to_bytes(5, "big")
     + (123456).to_bytes(3, "big"), "2024-01-02T03:04:05.123456"),
    ((rw.K_DATETIME2, 1, 0, 0, None), ((1 << 39) | ((2020 * 13) << 22)).to_bytes(5, "big") + bytes([50]),
     "2020-00-00T00:00:00.500000"),
    # TIMESTAMP2: big-endian epoch seconds; 0 is the zero timestamp
    ((rw.K_TIMESTAMP2, 0, 0, 0, None), (0).to_bytes(4, "big"), "0000-00-00T00:00:00.000000Z"),
    ((rw.K_TIMESTAMP2, 3, 0, 0, None), (2147483647).to_bytes(4, "big") + (9990).to_bytes(2, "big"),  # fsp 3: units of 100 us
     "2038-01-19T03:14:07.999000Z"),
    # TIME2: offset binary (0x800000 + packed h:m:s); a negative fraction borrows from the seconds
    ((rw.K_TIME2, 0, 0, 0, None), (0x800000 + (838 << 12 | 59 << 6 | 59)).to_bytes(3, "big"), "838:59:59.000000"),
    ((rw.K_TIME2, 2, 0, 0, None), bytes([0x7F, 0xFF, 0xFE, 0xE7]), "-00:00:01.250000"),
    ((rw.K_TIME2, 6, 0, 0, None), (0x800000000000 - 1).to_bytes(6, "big"), "-00:00:00.000001"),
    # ENUM (index, 0 is the empty value) and SET (bitmap, definition order)
    ((rw.K_ENUM, 2, 0, 0, (b"", b"a", b"b")), (2).to_bytes(2, "little"), "b"),
    ((rw.K_SET, 1, 0, 0, (b"a", b"b", b"c")), bytes([0b101]), "a,c"),
    ((rw.K_SET, 1, 0, 0, (b"a", b"b", b"c")), bytes([0]), ""),
]


@pytest.mark.parametrize("spec,raw,text", TEXT_CASES)
def test_binlog_encodings_give_the_canonical_text(spec, raw, text):
    data = b"\x00" + raw
    images, ops, _, _, keys, cols = _columns(_rows.decode(data, 0, len(data), 0, (spec,), (0,)))
    assert images == 1 and cols[0][1].decode() == text
    assert keys == [f'["{text}"]']


def test_bit_and_year_and_a_null_key_value():
    spec = ((rw.K_BIT, 10, 0, 0, None), (rw.K_YEAR, 0, 0, 0, None), (rw.K_YEAR, 0, 0, 0, None), INT8)
    data = b"\x08" + bytes([0xFF, 0xFF]) + bytes([0]) + bytes([255])  # BIT(10) keeps its low 10 bits
    _, _, _, _, keys, cols = _columns(_rows.decode(data, 0, len(data), 0, spec, (0, 1, 2, 3)))
    assert keys == ["[1023,0,2155,null]"]
    assert struct.unpack("<q", cols[0][1]) == (1023,)


def _col(name, type_, **kw):
    return SimpleNamespace(name=name, type=type_, character_set_name=kw.pop("charset", None),
                           unsigned=kw.pop("unsigned", False), **kw)


def test_the_typed_batch_equals_the_staging_typing_of_the_same_canonical_rows():
    """rows_walker.build_batch (typed buffers, Arrow casts) against arrow_types.type_images of
    the canonical rows the pure-Python reader gives, for a table of several logical types."""
    cols = [
        _col("id", 8, unsigned=True), _col("d", 246, precision=14, decimals=2), _col("dt", 10),
        _col("ts", 17, fsp=0), _col("s", 15, charset="utf8mb4", max_length=40), _col("f", 4),
        _col("b", 252, charset="binary", length_size=2),
    ]
    walker = rw.TableWalker.of(TableName("db", "t"), cols, ("id",))
    assert isinstance(walker, rw.TableWalker)
    assert [c.type for c in walker.schema.columns] == ["uint64", "decimal(14,2)", "date", "timestamptz", "string",
                                                       "float32", "binary"]
    rows = [
        b"\x00" + struct.pack("<Q", 2**64 - 1) + bytes([0x7F, 0xFF, 0xFF, 0xFF, 0xFB, 0x2D, 0xC7])
        + (0).to_bytes(3, "little") + (0).to_bytes(4, "big") + _str("é😀".encode()) + struct.pack("<f", 0.1)
        + _str(b"\x00\xff", 2),
        b"\x7e" + struct.pack("<Q", 7),  # every other column NULL
    ]
    data = b"".join(rows)
    out = _rows.decode(data, 0, len(data), 0, walker.spec, walker.key_idx)
    run = rw.RowsRun(walker, 3, 1000, 42_000, ("0-1-5", None, None, 1, 9, "binlog.000003"), *out, 0, len(out[1]))
    batch = rw.build_batch([run], "cdc.wm")
    (part,) = batch.parts
    canonical = [
        {"id": 2**64 - 1, "d": "-1234.56", "dt": "0000-00-00", "ts": "0000-00-00T00:00:00.000000Z", "s": "é😀",
         "f": 0.1, "b": "AP8="},
        {"id": 7, "d": None, "dt": None, "ts": None, "s": None, "f": None, "b": None},
    ]
    _, expect, schema, text = at.type_images(walker.schema, [None, None], canonical)
    assert text == [] and part.after.equals(expect) and part.before.null_count == 2
    events = batch.events()
    assert [e.key for e in events] == ["[18446744073709551615]", "[7]"]
    assert events[0].after == canonical[0] and events[1].after == {"id": 7}
    assert [e.position.encode() for e in events] == [
        f"{3:016x}{1000:016x}{i:08x}" for i in range(2)]
    assert events[0].origin == ("0-1-5", None, None, 1, 9, "binlog.000003") and events[0].ts_ms == 42_000
    # a run cut in two (a segment full inside the rows event) keeps its positions and images
    first, second = rw.build_batch([run[:1]], "cdc.wm"), rw.build_batch([run[1:]], "cdc.wm")
    assert [e.key for e in first.events() + second.events()] == ["[18446744073709551615]", "[7]"]
    assert second.events()[0].position.index == 1


def test_a_segment_beyond_32_bit_offsets_is_handed_over_as_events(monkeypatch):
    """A column of more than 2 GiB in one segment (one segment per run): the runs become
    LogEvents, which staging types in chunks (the limit lowered to inject it)."""
    walker = rw.TableWalker.of(TableName("db", "t"), [_col("id", 3), _col("s", 15, charset="utf8mb4", max_length=40)],
                               ("id",))
    runs = []
    for first in (0, 3):
        data = b"".join(b"\x00" + struct.pack("<i", i) + _str(b"x" * 10) for i in range(first, first + 3))
        out = _rows.decode(data, 0, len(data), 0, walker.spec, walker.key_idx)
        runs.append(rw.RowsRun(walker, 1, 4 + first, 0, None, *out, 0, 3))
    expect = rw.build_batch(runs, "cdc.wm").events()
    monkeypatch.setattr(rw, "_MAX_DATA", 50)  # a run's column (30 bytes) fits, the segment's (60) does not
    with pytest.raises(rw._TooLarge):
        rw.build_batch(runs, "cdc.wm")
    buf = rw.EventBuffer()
    for r in runs:
        buf.extend(r)
    got = buf.take("cdc.wm")
    assert isinstance(got, list) and got == expect and len(got) == 6 and len(buf) == 0
