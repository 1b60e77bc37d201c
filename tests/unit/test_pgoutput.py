"""pgoutput parsing and PostgreSQL text -> canonical decoding, without a server.

The messages are built byte by byte from the protocol documentation, so a parser that
misreads a field fails here; the integration tests then prove the server agrees."""

from __future__ import annotations

import struct

import pytest

from airflow_provider_cdc.core.errors import SourceError
from airflow_provider_cdc.dialects.postgres import (
    PgType,
    UnsupportedType,
    decoder,
    default_object_name,
    logical_type,
    numeric_type,
    parse_array,
    pgoutput,
)


def _tuple(*values) -> bytes:
    out = struct.pack("!H", len(values))
    for v in values:
        if v is None:
            out += b"n"
        elif v is pgoutput.UNCHANGED:
            out += b"u"
        else:
            b = v.encode()
            out += b"t" + struct.pack("!I", len(b)) + b
    return out


def test_begin_commit_carry_commit_lsn_and_time():
    ts_us = 789_000_123  # microseconds after 2000-01-01
    b = pgoutput.parse(b"B" + struct.pack("!QqI", 0x1_0000_00A0, ts_us, 42))
    assert b == pgoutput.Begin(0x1_0000_00A0, pgoutput.PG_EPOCH_MS + 789_000, 42)
    c = pgoutput.parse(b"C" + struct.pack("!BQQq", 0, 0x1_0000_00A0, 0x1_0000_00D0, ts_us))
    assert c == pgoutput.Commit(0x1_0000_00A0, 0x1_0000_00D0, pgoutput.PG_EPOCH_MS + 789_000)


def test_relation_with_key_flags_and_unicode_names():
    cols = [(1, 'or"der', 23, -1), (0, "ünï", 1700, (10 << 16 | 2) + 4)]
    body = struct.pack("!I", 7) + b"public" + b"\0" + 'T "q" ü'.encode() + b"\0" + b"f" + struct.pack("!H", 2)
    for flags, name, oid, typmod in cols:
        body += bytes([flags]) + name.encode() + b"\0" + struct.pack("!Ii", oid, typmod)
    r = pgoutput.parse(b"R" + body)
    assert r.relid == 7 and r.namespace == "public" and r.name == 'T "q" ü' and r.replica_identity == "f"
    assert r.columns[0] == pgoutput.RelationColumn('or"der', 23, -1, True)
    assert r.columns[1].is_key is False and r.columns[1].typmod == (10 << 16 | 2) + 4


def test_insert_update_delete_truncate():
    ins = pgoutput.parse(b"I" + struct.pack("!I", 7) + b"N" + _tuple("1", None, "ü ✓"))
    assert ins == pgoutput.Insert(7, ["1", None, "ü ✓"])
    upd = pgoutput.parse(b"U" + struct.pack("!I", 7) + b"N" + _tuple("1", pgoutput.UNCHANGED))
    assert upd.old is None and upd.new[1] is pgoutput.UNCHANGED
    upd = pgoutput.parse(
        b"U" + struct.pack("!I", 7) + b"O" + _tuple("1", "big") + b"N" + _tuple("2", pgoutput.UNCHANGED)
    )
    assert upd.old_kind == "O" and upd.old == ["1", "big"] and upd.new[0] == "2"
    upd = pgoutput.parse(b"U" + struct.pack("!I", 7) + b"K" + _tuple("1", None) + b"N" + _tuple("2", "x"))
    assert upd.old_kind == "K" and upd.old == ["1", None]
    dele = pgoutput.parse(b"D" + struct.pack("!I", 7) + b"K" + _tuple("5", None))
    assert dele == pgoutput.Delete(7, ["5", None], "K")
    tr = pgoutput.parse(b"T" + struct.pack("!IB", 2, 1) + struct.pack("!II", 7, 8))
    assert tr == pgoutput.Truncate((7, 8), True, False)
    assert pgoutput.parse(b"O" + b"\0" * 9) == pgoutput.Skipped("O")


def test_unknown_and_binary_values_are_protocol_errors():
    with pytest.raises(pgoutput.ProtocolError, match="unknown pgoutput message"):
        pgoutput.parse(b"Z123")
    with pytest.raises(pgoutput.ProtocolError, match="binary"):
        pgoutput.parse(
            b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!H", 1) + b"b" + struct.pack("!I", 1) + b"x"
        )


@pytest.mark.parametrize(
    ("logical", "text", "canonical"),
    [
        ("int64", "-9223372036854775808", -9223372036854775808),
        ("decimal(20,6)", "12.500000", "12.500000"),
        ("float32", "1.1", 1.1),
        ("float64", "-Infinity", "-Infinity"),
        ("float64", "NaN", "NaN"),
        ("bool", "f", False),
        ("binary", "\\x00ff10", "AP8Q"),
        ("binary", "\\x", ""),
        ("time", "23:59:58", "23:59:58.000000"),
        ("time", "00:00:00.5", "00:00:00.500000"),
        ("timestamp", "2024-01-02 03:04:05.25", "2024-01-02T03:04:05.250000"),
        ("timestamp", "infinity", "infinity"),
        ("timestamptz", "2024-01-02 03:04:05+00", "2024-01-02T03:04:05.000000Z"),
        ("timestamptz", "2024-01-02 03:04:05.123456+02:30", "2024-01-02T00:34:05.123456Z"),
        # BC: ISO 8601 astronomical years (1 BC = year 0), core/temporal.py
        ("timestamptz", "0044-03-15 12:00:00+00 BC", "-0043-03-15T12:00:00.000000Z"),
        ("timestamp", "0001-01-01 00:00:00.5 BC", "0000-01-01T00:00:00.500000"),
        ("timestamp", "10000-01-01 00:00:00", "10000-01-01T00:00:00.000000"),
        ("date", "0044-03-15 BC", "-0043-03-15"),
        ("date", "-infinity", "-infinity"),
        ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
        ("array<int32>", "{{1,2},{3,NULL}}", [[1, 2], [3, None]]),
        ("array<string>", '{"a b","c\\"d",NULL,"NULL","",x}', ["a b", 'c"d', None, "NULL", "", "x"]),
        ("array<binary>", '{"\\\\x00ff"}', ["AP8="]),
        ("array<int32>", "[0:1]={7,8}", [7, 8]),
        ("array<int32>", "{}", []),
    ],
)
def test_text_to_canonical(logical, text, canonical):
    assert decoder(logical)(text) == canonical


def test_malformed_array_is_an_error():
    with pytest.raises(SourceError, match="malformed array"):
        parse_array("{1,2", int)


def test_type_mapping():
    types = {
        1: PgType(1, "int4", "pg_catalog", "b", 0, 0, -1, "N"),
        2: PgType(2, "_int4", "pg_catalog", "b", 1, 0, -1, "A"),
        3: PgType(3, "mood", "public", "e", 0, 0, -1, "E"),
        4: PgType(4, "posint", "public", "d", 0, 1, -1, "N"),
        5: PgType(5, "numeric", "pg_catalog", "b", 0, 0, -1, "N"),
        6: PgType(6, "point", "pg_catalog", "b", 0, 0, -1, "G"),
        7: PgType(7, "citext", "public", "b", 0, 0, -1, "S"),
        8: PgType(8, "_numeric", "pg_catalog", "b", 5, 0, -1, "A"),
    }
    lt = lambda oid, typmod=-1: logical_type(oid, typmod, types.__getitem__)  # noqa: E731
    assert lt(2) == "array<int32>" and lt(3) == "string" and lt(4) == "int32" and lt(7) == "string"
    assert lt(5) == "decimal" and lt(5, (12 << 16 | 3) + 4) == "decimal(12,3)"
    assert lt(8, (6 << 16 | 2) + 4) == "array<decimal(6,2)>"
    with pytest.raises(UnsupportedType, match="point"):
        lt(6)
    assert numeric_type(((5 << 16) | (0x7FF & -2)) + 4) == "decimal"  # negative scale (PG 15)


def test_default_slot_name_is_valid():
    assert default_object_name("my_source_1") == "cdc_my_source_1"  # valid already: kept
    assert default_object_name("My-Source.1").startswith("cdc_my_source_1__")  # folded: + a hash
    assert len(default_object_name("x" * 100)) == 63


# --- the vectorised chunk path (pgcopy) must write what the encoder writes ------------

TRICKY = [
    "",
    "plain",
    'q"uote',
    "back\\slash",
    "\\x00ff",
    "ünï ✓ 🚀",
    "tab\there",
    "nl\nx",
    "\x01\x1f",
    "\u2028",
    "'",
    "\x7f",
]


def test_vectorised_json_strings_equal_the_encoder():
    import json

    import pyarrow as pa

    from airflow_provider_cdc.dialects.postgres.pgcopy import json_strings

    enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    clean = [v for v in TRICKY if not any(ord(ch) < 32 for ch in v)] + [None]
    assert json_strings(pa.array(clean, pa.string())).to_pylist() == [
        "null" if v is None else enc(v) for v in clean
    ]
    every = [*TRICKY, None]  # with control characters: the fallback path
    assert json_strings(pa.array(every, pa.string())).to_pylist() == [
        "null" if v is None else enc(v) for v in every
    ]


def test_chunk_assembler_rows_equal_the_decoders():
    """The COPY path's typed columns equal the reference: each value through the decoder
    (as the changelog's), then decode_column; keys equal encode_key of the same values."""
    import pyarrow as pa

    from airflow_provider_cdc.core.arrow_types import decode_column
    from airflow_provider_cdc.core.schema import encode_key
    from airflow_provider_cdc.dialects.postgres.pgcopy import ChunkAssembler

    names = ["id", 'we"ird', "b", "f", "t", "u", "n", "a"]
    types = ["int64", "string", "bool", "float64", "timestamptz", "uuid", "decimal(5,2)", "array<int32>"]
    rows = [
        [
            "-5",
            'x"y',
            "t",
            "1e+15",
            "2024-01-02 03:04:05.5+00",
            "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11",
            "1.50",
            "{1,NULL}",
        ],
        ["7", None, None, "NaN", None, None, None, None],
    ]
    decs = [decoder(t) for t in types]
    asm = ChunkAssembler(names, types, decs, ["id", 'we"ird'])
    cols = [pa.array([r[i] for r in rows], pa.string()) for i in range(len(names))]
    key, typed, text, last = asm.build_typed(cols)
    canon = [{n: (None if v is None else d(v)) for n, d, v in zip(names, decs, r, strict=True)} for r in rows]
    assert text == []
    for name, logical, arr in zip(names, types, typed, strict=True):
        assert _same(arr, decode_column([c[name] for c in canon], logical)), name
    assert key.to_pylist() == [encode_key([c["id"], c['we"ird']]) for c in canon]
    assert last == (7, None)


@pytest.mark.parametrize(
    ("logical", "texts"),
    [
        (
            "timestamptz",
            ["2024-01-02 03:04:05+00", "2024-01-02 03:04:05.000001+00", None, "2024-01-02 03:04:05.5+00"],
        ),
        (
            "timestamptz",
            ["2024-01-02 03:04:05+00", "infinity", "0044-03-15 12:00:00+00 BC", "12345-01-01 00:00:00+00"],
        ),
        ("timestamp", ["2024-01-02 03:04:05", "1999-12-31 23:59:59.123", None]),
        ("timestamp", ["-infinity", "2024-01-02 03:04:05"]),
        ("time", ["00:00:00", "23:59:58.5", "24:00:00", None]),
        ("float64", ["0.1", "1e+15", "-0", "NaN", "Infinity", "-Infinity", "1.7976931348623157e+308", None]),
        ("float32", ["1.1", "3.4028235e+38", "1e-45"]),
        ("binary", ["\\x", "\\x00ff10", None, "\\x" + "ab" * 100]),
        ("binary", [None, "\\xDEADbeef", None]),
        ("binary", [None, None]),
        ("date", ["2024-02-29", "infinity", None]),
        ("date", ["2024-02-29", "0044-03-15 BC", "12345-01-01", "-infinity"]),
        ("array<timestamptz>", ['{"2024-01-01 00:00:00+00",NULL}']),
    ],
)
def test_specialised_fragments_equal_the_encoder(logical, texts):
    import json

    import pyarrow as pa

    from airflow_provider_cdc.dialects.postgres.pgcopy import fragment_builder

    enc = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
    dec = decoder(logical)
    got = fragment_builder(logical, dec)(pa.array(texts, pa.string())).to_pylist()
    assert got == ["null" if t is None else enc(dec(t)) for t in texts]


@pytest.mark.parametrize(
    ("logical", "texts"),
    [
        ("timestamptz", ["2024-01-02 03:04:05+00", "2024-01-02 03:04:05.000001+00", None, "2024-01-02 03:04:05.5+00"]),
        ("timestamptz", ["2024-01-02 03:04:05+00", "infinity", "0044-03-15 12:00:00+00 BC", "12345-01-01 00:00:00+00"]),
        ("timestamp", ["2024-01-02 03:04:05", "1999-12-31 23:59:59.123", None]),
        ("timestamp", ["-infinity", "2024-01-02 03:04:05"]),
        ("time", ["00:00:00", "23:59:58.5", "24:00:00", None]),
        ("float64", ["0.1", "1e+15", "-0", "NaN", "Infinity", "-Infinity", "1.7976931348623157e+308", None]),
        ("float32", ["1.1", "3.4028235e+38", "1e-45"]),
        ("decimal(5,2)", ["1.50", "-999.99", None]),
        ("decimal(5,2)", ["1.50", "NaN"]),
        ("int16", ["-32768", "32767", None]),
        ("bool", ["t", "f", None]),
        ("uuid", ["A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", None]),
        ("binary", ["\\x", "\\x00ff10", None, "\\x" + "ab" * 100]),
        ("binary", [None, "\\xDEADbeef", None]),
        ("binary", [None, None]),
        ("date", ["2024-02-29", "infinity", None]),
        ("date", ["2024-02-29", "0044-03-15 BC", "12345-01-01", "-infinity"]),
        ("array<timestamptz>", ['{"2024-01-01 00:00:00+00",NULL}']),
    ],
)
def test_typed_columns_from_copy_text_equal_the_decoders(logical, texts):
    """Arrow's kernels give the typed column the decoder path gives, or decline (None) so the
    chunk takes that path (infinities, BC dates, a NaN numeric, arrays)."""
    import pyarrow as pa

    from airflow_provider_cdc.core.arrow_types import decode_column
    from airflow_provider_cdc.core.errors import ConfigurationError
    from airflow_provider_cdc.dialects.postgres.pgcopy import typed_builder

    dec = decoder(logical)
    got = typed_builder(logical)(pa.array(texts, pa.string()))
    try:
        want = decode_column([None if t is None else dec(t) for t in texts], logical)
    except ConfigurationError:
        want = None  # a value the type cannot hold: the chunk keeps the column as text
    if got is not None:
        assert want is not None and _same(got, want), (got, want)
    else:
        assert want is None or logical.startswith("array<") or any(
            t is not None and ("infinity" in t or "BC" in t or len(t.split("-")[0]) > 4) for t in texts)


def _same(a, b) -> bool:
    """Same type and values, NaN equal to NaN (Arrow's equals says no)."""
    return a.type == b.type and [repr(v) for v in a.to_pylist()] == [repr(v) for v in b.to_pylist()]


def test_tuples_parsed_together_equal_one_message_at_a_time():
    """pgoutput.parse_tuples (numpy over many messages) against the one-message parser, on
    random tuples: text values of every length (empty, multi-byte UTF-8, 300 bytes), NULLs
    and unchanged TOAST markers, messages of different sizes in one buffer."""
    import random

    import numpy as np

    rng = random.Random(7)
    words = ["", "a", "é✓🚀", "x" * 300, "tab\tnew\nline", "0"]
    ncols, messages, expected = 5, [], []
    for _ in range(200):
        values = [rng.choice([None, pgoutput.UNCHANGED, *words]) for _ in range(ncols)]
        messages.append(b"I" + struct.pack("!I", 7) + b"N" + _tuple(*values))
        expected.append(pgoutput.parse(messages[-1]).new)
    sizes = np.array([len(m) for m in messages])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    buf = np.frombuffer(b"".join(messages) + b"\0" * 8, dtype=np.uint8)
    cols = pgoutput.parse_tuples(buf, starts + 6, ncols)
    assert (cols.end == starts + sizes).all()
    for j in range(ncols):
        text = cols.text(j).to_pylist()
        for i, row in enumerate(expected):
            assert cols.kinds[j][i] == {None: ord("n"), pgoutput.UNCHANGED: ord("u")}.get(row[j], ord("t"))
            assert text[i] == (row[j] if isinstance(row[j], str) else None)
    with pytest.raises(pgoutput.ProtocolError, match="columns"):
        pgoutput.parse_tuples(buf, starts + 6, ncols + 1)
    bad = np.frombuffer(b"I" + struct.pack("!I", 7) + b"N" + struct.pack("!H", 1) + b"t" + struct.pack("!I", 2)
                        + b"\xff\xfe" + b"\0" * 8, dtype=np.uint8)
    with pytest.raises(pgoutput.ProtocolError, match="UTF-8"):
        pgoutput.parse_tuples(bad, np.array([6]), 1).text(0)


@pytest.mark.parametrize("texts", [["\\x0", None], ["\\xzz"], ["abc"], ["\\x00", "\\000"]])
def test_malformed_or_escape_format_bytea_takes_the_decoder(texts):
    import pyarrow as pa

    from airflow_provider_cdc.dialects.postgres.pgcopy import typed_builder

    assert typed_builder("binary")(pa.array(texts, pa.string())) is None
