"""Property tests of the compiled rows walker (dialects/mysql/_rows.c) on what a server can send:
random bytes, valid row images truncated at every length, bytes flipped, inserted and dropped,
and column specs with hostile TABLE_MAP metadata (mysql-replication reads widths, precision,
scale, fsp, BIT sizes and BLOB length sizes as unsigned bytes, so any of 0..255 reaches the
walker).

The property: ``_rows.decode`` returns buffers that agree with its image and event counts, or
raises ValueError (the caller then reads the event the pure-Python way): never another
exception, never a crash, never a hang. A crash kills pytest; faulthandler (on in pytest) names
the test. ``CDC_ROWS_FUZZ_EXAMPLES`` sets the examples per property (default 300).
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_provider_cdc.dialects.mysql import rows_walker as rw

pytestmark = pytest.mark.skipif(not rw.available(), reason="the compiled rows walker is not built")
_rows = rw._rows

EXAMPLES = int(os.environ.get("CDC_ROWS_FUZZ_EXAMPLES", "300"))
# database=None: no example database in the shared working tree (print_blob gives the reproducer)
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, print_blob=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_DIG2BYTES = (0, 1, 1, 2, 2, 3, 3, 4, 4, 4)
_FIXED_SIZE = {rw.K_INT: 8, rw.K_YEAR: 8, rw.K_BIT: 8, rw.K_FLOAT: 4, rw.K_DOUBLE: 8}


def _decimal_size(prec: int, scale: int) -> int:
    intg = prec - scale
    return intg // 9 * 4 + _DIG2BYTES[intg % 9] + scale // 9 * 4 + _DIG2BYTES[scale % 9]


def _decimal_bytes(prec: int, scale: int, intval: int, fracval: int, negative: bool) -> bytes:
    """MySQL's packed DECIMAL of sign, integer part and fraction digits."""
    intg = prec - scale
    istr, fstr = str(intval).rjust(intg, "0") if intg else "", str(fracval).rjust(scale, "0") if scale else ""
    out = b""
    head = intg % 9
    if head:
        out += int(istr[:head]).to_bytes(_DIG2BYTES[head], "big")
    for i in range(intg // 9):
        out += int(istr[head + 9 * i:head + 9 * i + 9]).to_bytes(4, "big")
    for i in range(scale // 9):
        out += int(fstr[9 * i:9 * i + 9]).to_bytes(4, "big")
    if scale % 9:
        out += int(fstr[scale // 9 * 9:]).to_bytes(_DIG2BYTES[scale % 9], "big")
    b = bytearray(out)
    b[0] ^= 0x80
    return bytes(x ^ 0xFF for x in b) if negative else bytes(b)


# --- a column: (its spec, a strategy of one encoded value, or None: the value's expected text) ---

@st.composite
def _column(draw, keyable: bool = False):
    """(spec, draw_value) where draw_value(draw) -> (encoded bytes, expected text or None)."""
    kinds = ["int", "year", "decimal", "bit", "str", "enum", "set", "date", "datetime", "timestamp", "time"]
    if not keyable:
        kinds += ["float", "double"]
    kind = draw(st.sampled_from(kinds))
    raw = lambda n: (lambda d: (d(st.binary(min_size=n, max_size=n)), None))  # noqa: E731
    if kind == "int":
        w = draw(st.sampled_from([1, 2, 3, 4, 8]))
        return (rw.K_INT, w, draw(st.integers(0, 1)), 0, None), raw(w)
    if kind == "year":
        return (rw.K_YEAR, 0, 0, 0, None), raw(1)
    if kind == "float":
        return (rw.K_FLOAT, 0, 0, 0, None), raw(4)
    if kind == "double":
        return (rw.K_DOUBLE, 0, 0, 0, None), raw(8)
    if kind == "decimal":
        prec = draw(st.integers(1, 65))
        scale = draw(st.integers(0, min(prec, 38)))

        def dec(d):
            i = d(st.integers(0, 10 ** (prec - scale) - 1))
            f = d(st.integers(0, 10 ** scale - 1))
            neg = d(st.booleans()) and (i or f)
            text = ("-" if neg else "") + str(i) + (f".{str(f).rjust(scale, '0')}" if scale else "")
            return _decimal_bytes(prec, scale, i, f, bool(neg)), text
        return (rw.K_DECIMAL, prec, scale, 0, None), dec
    if kind == "bit":
        bits = draw(st.integers(1, 64))
        return (rw.K_BIT, bits, 0, 0, None), raw((bits + 7) // 8)
    if kind == "str":
        lb = draw(st.integers(1, 4))
        binary = draw(st.integers(0, 1))
        pad = draw(st.integers(0, 255)) if binary else 0
        cap = min(2 ** (8 * lb) - 1, 300)

        def s(d):
            v = d(st.binary(max_size=cap))
            text = v + b"\0" * max(0, pad - len(v))
            return len(v).to_bytes(lb, "little") + v, text
        return (rw.K_STR, lb, pad, binary, None), s
    if kind in ("enum", "set"):
        if kind == "enum":  # an index among the values (0 is the empty value of an invalid one)
            names = tuple(draw(st.lists(st.binary(max_size=6), min_size=1, max_size=300)))
            size = 1 if len(names) < 256 else 2
            return (rw.K_ENUM, size, 0, 0, names), lambda d: (d(st.integers(0, len(names) - 1)).to_bytes(size, "little"),
                                                               None)
        names = tuple(draw(st.lists(st.binary(max_size=6), max_size=64)))
        size = draw(st.sampled_from([1, 2, 3, 4, 8]))
        return (rw.K_SET, size, 0, 0, names), raw(size)
    if kind == "date":
        return (rw.K_DATE, 0, 0, 0, None), raw(3)
    fsp = draw(st.integers(0, 6))
    code, base = {"datetime": (rw.K_DATETIME2, 5), "timestamp": (rw.K_TIMESTAMP2, 4), "time": (rw.K_TIME2, 3)}[kind]
    n = (fsp + 1) // 2
    if code == rw.K_TIME2:
        return (code, fsp, 0, 0, None), raw(base + n)
    # DATETIME and TIMESTAMP: a fraction of n big-endian bytes below 10^(2n) (a negative one is refused)
    return (code, fsp, 0, 0, None), lambda d: (d(st.binary(min_size=base, max_size=base))
                                               + d(st.integers(0, 10 ** (2 * n) - 1)).to_bytes(n, "big"), None)


@st.composite
def _event(draw):
    """A rows event of valid images: (data, kind, spec, key columns, images, expected texts)."""
    cols = draw(st.lists(_column(), min_size=1, max_size=10))
    spec = tuple(c[0] for c in cols)
    keyable = [i for i, s in enumerate(spec) if s[0] not in (rw.K_FLOAT, rw.K_DOUBLE)]
    keys = tuple(draw(st.lists(st.sampled_from(keyable), max_size=3))) if keyable else ()
    kind = draw(st.integers(0, 2))
    n_images = draw(st.integers(1, 4)) * (2 if kind == 1 else 1)
    data, texts = b"", []
    for _ in range(n_images):
        nulls = draw(st.integers(0, 2 ** len(cols) - 1))
        row = nulls.to_bytes((len(cols) + 7) // 8, "little")
        for i, (_, value) in enumerate(cols):
            if nulls >> i & 1:
                texts.append((i, None))
                continue
            b, text = value(draw)
            row += b
            texts.append((i, text))
        data += row
    return data, kind, spec, keys, n_images, texts


def _check(out, spec: tuple, keys: tuple, kind: int) -> None:
    """Buffers that agree with the image and event counts they say."""
    images, ops, before, after, kdata, klens, cols = out
    assert isinstance(images, int) and images >= 0
    n = len(ops)
    assert len(before) == len(after) == len(klens) == 4 * n
    b, a, kl = (struct.unpack(f"<{n}i", x) for x in (before, after, klens))
    assert all(x >= 0 for x in kl) and sum(kl) == len(kdata)
    if kind == 1:
        assert images % 2 == 0 and images // 2 <= n <= images
    else:
        assert n == images
    at = 0
    for op, bi, ai, ln in zip(ops, b, a, kl, strict=True):
        assert op in (0, 1, 2) and -1 <= bi < images and -1 <= ai < images
        assert (bi == -1) == (op == 0) and (ai == -1) == (op == 2)
        key = kdata[at:at + ln]
        at += ln
        try:
            text = key.decode()
        except UnicodeDecodeError:  # a text key of bytes that are not UTF-8 (staging refuses its column)
            continue
        assert len(json.loads(text)) == len(keys)
    assert len(cols) == len(spec)
    for (valid, data, lens), sp in zip(cols, spec, strict=True):
        assert len(valid) == images and set(valid) <= {0, 1}
        if sp[0] in _FIXED_SIZE:
            assert lens is None and len(data) == images * _FIXED_SIZE[sp[0]]
        else:
            ls = struct.unpack(f"<{images}i", lens)
            assert all(x >= 0 for x in ls) and sum(ls) == len(data)


def _decode(data: bytes, start: int, end: int, kind: int, spec: tuple, keys: tuple):
    """decode, checked: its result, or None when it refused the input with ValueError."""
    try:
        out = _rows.decode(data, start, end, kind, spec, keys)
    except ValueError:
        return None
    _check(out, spec, keys, kind)
    return out


def _values(out, spec: tuple) -> list:
    """The decoded values of the text columns, image by image, column by column."""
    got = []
    images, cols = out[0], out[6]
    offsets = []
    for (_, data, lens), sp in zip(cols, spec, strict=True):
        ls = struct.unpack(f"<{images}i", lens) if sp[0] not in _FIXED_SIZE else None
        offsets.append((data, ls, [0]))
    for r in range(images):
        for i, (data, ls, at) in enumerate(offsets):
            if cols[i][0][r] == 0:
                got.append((i, None))
            elif ls is None:
                got.append((i, data[8 * r:8 * r + 8] if spec[i][0] != rw.K_FLOAT else data[4 * r:4 * r + 4]))
            else:
                got.append((i, data[at[0]:at[0] + ls[r]]))
            if ls is not None:
                at[0] += ls[r]
    return got


@SETTINGS
@given(ev=_event(), junk=st.tuples(st.binary(max_size=8), st.binary(max_size=8)))
def test_valid_images_decode_and_every_truncation_returns_or_raises_value_error(ev, junk):
    data, kind, spec, keys, n_images, texts = ev
    whole = junk[0] + data + junk[1]
    start, end = len(junk[0]), len(junk[0]) + len(data)
    out = _decode(whole, start, end, kind, spec, keys)
    assert out is not None and out[0] == n_images
    # the values the encoders know (DECIMAL text, strings with their BINARY padding) come back
    for (i, want), (j, got) in zip(texts, _values(out, spec), strict=True):
        assert i == j
        if want is None:
            continue
        if isinstance(want, str):
            assert got == want.encode()
        else:
            assert got == want
    for cut in range(start, end):
        _decode(whole, start, cut, kind, spec, keys)


def _mutate(draw, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete"]))
        at = draw(st.integers(0, max(0, len(b) - 1)))
        if op == "flip" and b:
            b[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and b:
            b[at] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE]))
        elif op == "insert":
            b[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif b:
            del b[at:at + draw(st.integers(1, 4))]
    return bytes(b)


@SETTINGS
@given(ev=_event(), data=st.data())
def test_flipped_inserted_and_dropped_bytes_return_or_raise_value_error(ev, data):
    raw, kind, spec, keys, _, _ = ev
    mutated = _mutate(data.draw, raw)
    _decode(mutated, 0, len(mutated), kind, spec, keys)


@SETTINGS
@given(cols=st.lists(_column(), max_size=8), raw=st.binary(max_size=200), kind=st.integers(0, 2), data=st.data())
def test_random_bytes_return_or_raise_value_error(cols, raw, kind, data):
    spec = tuple(c[0] for c in cols)
    keys = tuple(data.draw(st.lists(st.integers(0, len(spec) - 1), max_size=3))) if spec else ()
    start = data.draw(st.integers(0, len(raw)))
    end = data.draw(st.integers(start, len(raw)))
    _decode(raw, start, end, kind, spec, keys)


# hostile metadata: the bytes mysql-replication reads (0..255, BIT's 0..2295, VARCHAR's 0..65535)
# and a few beyond them (a spec is C ints)
_META = st.one_of(st.integers(0, 255), st.sampled_from([-(2**31), -9, -1, 256, 2295, 65535, 2**31 - 1]))


@st.composite
def _hostile_column(draw):
    code = draw(st.one_of(st.integers(1, 13), st.sampled_from([0, 14, -1, 255])))
    names = draw(st.one_of(st.none(), st.lists(st.binary(max_size=4), max_size=70).map(tuple)))
    return (code, draw(_META), draw(_META), draw(st.integers(0, 1)), names)


@SETTINGS
@given(cols=st.lists(_hostile_column(), max_size=6), raw=st.binary(max_size=300), kind=st.integers(0, 2),
       data=st.data())
def test_hostile_column_metadata_returns_or_raises_value_error(cols, raw, kind, data):
    spec = tuple(cols)
    keys = tuple(data.draw(st.lists(st.integers(-2, len(spec) + 1), max_size=3)))
    _decode(raw, 0, len(raw), kind, spec, keys)


@SETTINGS
@given(ev=_event(), col=st.integers(0, 9), meta=st.tuples(_META, _META), data=st.data())
def test_valid_images_under_hostile_metadata_return_or_raise_value_error(ev, col, meta, data):
    """A real event's images read with one column's metadata replaced (a table map that lies)."""
    raw, kind, spec, keys, _, _ = ev
    i = col % len(spec)
    spec = spec[:i] + ((spec[i][0], meta[0], meta[1], spec[i][3], spec[i][4]),) + spec[i + 1:]
    _decode(raw, 0, len(raw), kind, spec, keys)


# --- the findings of the review, each once (they crashed, hung, read out of bounds or misread) ---
_STR = rw.K_STR
REFUSED = [
    # a BLOB length size of 8 (its metadata is a byte): the length plus its bytes wrapped, memcpy of -8 bytes
    ("blob length size 8", b"\x00" + b"\xf8" + b"\xff" * 7 + b"x" * 8, ((_STR, 8, 0, 0, None),), ()),
    ("blob length size 0", b"\x00abc", ((_STR, 0, 0, 0, None),), ()),
    ("string length size -1", b"\x00abc", ((_STR, -1, 0, 0, None),), ()),  # SystemError: NULL without exception
    ("BINARY pad beyond 255", b"\x00\x00", ((_STR, 1, 2**31 - 1, 1, None),), ()),  # 2 GiB per value
    ("int width 0", b"\x00", ((rw.K_INT, 0, 0, 0, None),), ()),
    ("int width -1", b"\x00", ((rw.K_INT, -1, 0, 0, None),), ()),
    ("int width 9", b"\x00" + b"\x01" * 9, ((rw.K_INT, 9, 0, 0, None),), ()),
    ("BIT(0) at the end of the data", b"\x00", ((rw.K_BIT, 0, 0, 0, None),), ()),  # read p[0] past the end
    ("BIT(65)", b"\x00" + b"\x01" * 9, ((rw.K_BIT, 65, 0, 0, None),), ()),
    ("ENUM size 0", b"\x00", ((rw.K_ENUM, 0, 0, 0, (b"a",)),), ()),
    ("SET size 9", b"\x00" + b"\x01" * 9, ((rw.K_SET, 9, 0, 0, (b"a",)),), ()),
    ("DECIMAL(0,0)", b"\x00", ((rw.K_DECIMAL, 0, 0, 0, None),), ()),  # read uninitialised stack, took 0 bytes
    ("DECIMAL scale > precision", b"\x00" + b"\x80" * 40, ((rw.K_DECIMAL, 2, 30, 0, None),), ()),
    ("DECIMAL(66)", b"\x00" + b"\x80" * 40, ((rw.K_DECIMAL, 66, 0, 0, None),), ()),
    ("DATETIME fsp 15", b"\x00\x80" + b"\xff" * 20, ((rw.K_DATETIME2, 15, 0, 0, None),), ()),  # 1L << 63, 1L << 64
    ("TIMESTAMP fsp -3", b"\x00" + b"\x01" * 10, ((rw.K_TIMESTAMP2, -3, 0, 0, None),), ()),
    ("TIME fsp 7", b"\x00" + b"\x80" * 10, ((rw.K_TIME2, 7, 0, 0, None),), ()),
    ("unknown type, every value NULL", b"\x01", ((99, 0, 0, 0, None),), ()),
    ("no columns", b"\x00", (), ()),  # nothing consumed per image: looped until memory ran out
]


@pytest.mark.parametrize("data,spec,keys", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
@pytest.mark.parametrize("kind", [0, 1, 2])
def test_hostile_metadata_found_in_review_is_refused(data, spec, keys, kind):
    with pytest.raises(ValueError):
        _rows.decode(data, 0, len(data), kind, spec, keys)


def test_no_columns_and_no_rows_is_an_empty_result():
    assert _rows.decode(b"", 0, 0, 0, (), ()) == (0, b"", b"", b"", b"", b"", [])
