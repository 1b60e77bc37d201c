/* The compiled binlog rows walker (dialects/mysql/rows_walker.py is its Python side).
 *
 * A WRITE/UPDATE/DELETE rows event concatenates row images without per-row lengths: where a
 * row ends is only known by decoding every column of it. This walks the images of one rows
 * event and returns, a column at a time, the canonical values the pure-Python reader
 * (mysql-replication plus dialects/mysql/types.py binlog_converter) gives, in buffers Arrow
 * takes as they are:
 *
 *   integers, YEAR, BIT  -> int64 (BIGINT UNSIGNED and BIT(64): the uint64 bits)
 *   FLOAT / DOUBLE       -> float32 / float64
 *   strings, BLOB/TEXT   -> bytes (BINARY(n) padded to n with 0x00 as a SELECT returns it)
 *   ENUM / SET           -> their names as text (SET: in definition order, comma-joined)
 *   DECIMAL, DATE, TIME, DATETIME, TIMESTAMP -> canonical text (types.py: "-12.50",
 *                           "2020-00-00", "-838:59:59.000000", "2024-01-02T03:04:05.123456",
 *                           "...Z"); Python types it with Arrow's parsers as staging types
 *                           canonical text
 *
 * and per event (a key-changing UPDATE is two: a delete of the old key, a create of the new
 * one, as log_reader._row_events makes them) its op, before/after image numbers and its key
 * as the compact JSON of core/schema.encode_key.
 *
 * decode(data, start, end, kind, columns, key_columns) -> (images, ops, before, after,
 *        key_data, key_lengths, [(valid, data, lengths|None) per column])
 *   kind: 0 write, 1 update, 2 delete; columns: ((code, a, b, c, names), ...) as
 *   rows_walker.column_spec builds them. Anything it cannot read raises ValueError (the
 *   caller falls back to the pure-Python reader for that event).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum {
    K_INT = 1,       /* a: width 1,2,3,4,8; b: unsigned */
    K_YEAR = 2,
    K_FLOAT = 3,
    K_DOUBLE = 4,
    K_DECIMAL = 5,   /* a: precision, b: scale */
    K_BIT = 6,       /* a: bits */
    K_STR = 7,       /* a: length bytes (1-4); b: pad width (BINARY(n)); c: binary (key as base64) */
    K_ENUM = 8,      /* a: size (1, 2); names */
    K_SET = 9,       /* a: size (1-8); names */
    K_DATE = 10,
    K_DATETIME2 = 11, /* a: fsp */
    K_TIMESTAMP2 = 12, /* a: fsp */
    K_TIME2 = 13,    /* a: fsp */
};

typedef struct {
    char *p;
    Py_ssize_t len, cap;
} Buf;

static int buf_reserve(Buf *b, Py_ssize_t more) {
    if (more < 0 || more > PY_SSIZE_T_MAX - b->len) { PyErr_NoMemory(); return -1; }
    Py_ssize_t need = b->len + more;
    if (need <= b->cap) return 0;
    Py_ssize_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    char *p = PyMem_Realloc(b->p, cap);
    if (!p) { PyErr_NoMemory(); return -1; }
    b->p = p; b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, Py_ssize_t n) {
    if (n == 0) return 0;  /* src (an empty buffer's p) may be NULL: memcpy must not see it */
    if (buf_reserve(b, n) < 0) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

static inline int buf_byte(Buf *b, char c) { return buf_put(b, &c, 1); }

static void buf_free(Buf *b) { PyMem_Free(b->p); b->p = NULL; b->len = b->cap = 0; }

static PyObject *buf_bytes(Buf *b) { return PyBytes_FromStringAndSize(b->p ? b->p : "", b->len); }

typedef struct {
    int code, a, b, c;
    Py_ssize_t nnames;
    const char **names;       /* borrowed from the spec's bytes objects */
    Py_ssize_t *name_len;
    int is_key;
    Buf valid, data, lens;
} Col;

static int fail(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
}

static inline uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static inline uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

static inline int fsp_bytes(int fsp) { return (fsp + 1) / 2; }

/* ``n`` digits of v, zero-padded (v < 10^n); returns the end */
static inline char *digits(char *o, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; i--) { o[i] = (char)('0' + v % 10); v /= 10; }
    return o + n;
}

/* v in decimal (Python's str(int)); returns the end */
static inline char *utoa(char *o, uint64_t v) {
    char t[20];
    int n = 0;
    do { t[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    while (n) *o++ = t[--n];
    return o;
}

static inline char *itoa64(char *o, int64_t v) {
    if (v < 0) { *o++ = '-'; return utoa(o, (uint64_t)0 - (uint64_t)v); }
    return utoa(o, (uint64_t)v);
}

/* at least ``n`` digits, as f"{v:0{n}d}" */
static inline char *padded(char *o, uint64_t v, int n) {
    uint64_t lim = 1;
    for (int i = 0; i < n; i++) lim *= 10;
    return v < lim ? digits(o, v, n) : utoa(o, v);
}

/* YYYY-MM-DD */
static inline char *ymd(char *o, uint64_t y, unsigned m, unsigned d) {
    o = padded(o, y, 4); *o++ = '-'; o = padded(o, m, 2); *o++ = '-'; return padded(o, d, 2);
}

/* HH:MM:SS.ffffff (hours: at least two digits) */
static inline char *hmsf(char *o, uint64_t h, unsigned mi, unsigned s, uint64_t us) {
    o = padded(o, h, 2); *o++ = ':'; o = padded(o, mi, 2); *o++ = ':'; o = padded(o, s, 2); *o++ = '.';
    return padded(o, us, 6);
}

/* the fraction of DATETIME2/TIMESTAMP2 as microseconds (mysql-replication's __read_fsp) */
static inline long fsp_micros(const unsigned char *p, int fsp) {
    int n = fsp_bytes(fsp);
    if (!n) return 0;
    long v = (long)be(p, n);
    /* read as a signed big-endian integer, as the reference does */
    if (v & (1L << (8 * n - 1))) v -= 1L << (8 * n);
    if (fsp % 2) v = (long)(v / 10);  /* int(v / 10): toward zero */
    for (int i = fsp; i < 6; i++) v *= 10;
    return v;
}

static const int dig2bytes[10] = {0, 1, 1, 2, 2, 3, 3, 4, 4, 4};

static Py_ssize_t decimal_size(int prec, int scale) {
    int intg = prec - scale;
    return (intg / 9) * 4 + dig2bytes[intg % 9] + (scale / 9) * 4 + dig2bytes[scale % 9];
}

/* MySQL's packed DECIMAL -> format(Decimal(v), "f"): the sign, the integer digits without
 * leading zeros (at least one), the scale's digits */
static int decimal_text(const unsigned char *p, int prec, int scale, Buf *out) {
    unsigned char tmp[80];
    Py_ssize_t size = decimal_size(prec, scale);
    if (size > (Py_ssize_t)sizeof(tmp) || prec < scale) return fail("DECIMAL precision out of range");
    memcpy(tmp, p, size);
    int negative = !(tmp[0] & 0x80);
    tmp[0] ^= 0x80;
    if (negative)
        for (Py_ssize_t i = 0; i < size; i++) tmp[i] ^= 0xFF;
    int intg = prec - scale, intg0 = intg / 9, intg0x = intg % 9, frac0 = scale / 9, frac0x = scale % 9;
    char digits[220];
    int nd = 0;
    const unsigned char *q = tmp;
    if (intg0x) {
        int n = dig2bytes[intg0x];
        nd = (int)(padded(digits + nd, be(q, n), intg0x) - digits);
        q += n;
    }
    for (int i = 0; i < intg0; i++, q += 4) nd = (int)(padded(digits + nd, be(q, 4), 9) - digits);
    int start = 0;
    while (start < nd - 1 && digits[start] == '0') start++;
    if (nd == 0) { digits[0] = '0'; nd = 1; }
    if (negative && buf_byte(out, '-') < 0) return -1;
    if (buf_put(out, digits + start, nd - start) < 0) return -1;
    if (scale) {
        char frac[220];
        int nf = 0;
        for (int i = 0; i < frac0; i++, q += 4) nf = (int)(padded(frac + nf, be(q, 4), 9) - frac);
        if (frac0x) {
            int n = dig2bytes[frac0x];
            nf = (int)(padded(frac + nf, be(q, n), frac0x) - frac);
        }
        if (buf_byte(out, '.') < 0 || buf_put(out, frac, nf) < 0) return -1;
    }
    return 0;
}

/* days since 1970-01-01 -> civil date (Howard Hinnant's algorithm) */
static void civil(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
    z += 719468;
    int64_t era = (z >= 0 ? z : z - 146096) / 146097;
    unsigned doe = (unsigned)(z - era * 146097);
    unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    int64_t yy = (int64_t)yoe + era * 400;
    unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    unsigned mp = (5 * doy + 2) / 153;
    *d = doy - (153 * mp + 2) / 5 + 1;
    *m = mp < 10 ? mp + 3 : mp - 9;
    *y = yy + (*m <= 2);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static int base64(Buf *out, const unsigned char *p, Py_ssize_t n) {
    if (buf_reserve(out, 4 * ((n + 2) / 3)) < 0) return -1;
    char *o = out->p + out->len;
    Py_ssize_t i = 0;
    for (; i + 2 < n; i += 3) {
        uint32_t v = (p[i] << 16) | (p[i + 1] << 8) | p[i + 2];
        *o++ = B64[v >> 18]; *o++ = B64[(v >> 12) & 63]; *o++ = B64[(v >> 6) & 63]; *o++ = B64[v & 63];
    }
    if (i < n) {
        uint32_t v = p[i] << 16;
        if (i + 1 < n) v |= p[i + 1] << 8;
        *o++ = B64[v >> 18]; *o++ = B64[(v >> 12) & 63];
        *o++ = i + 1 < n ? B64[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    out->len = o - out->p;
    return 0;
}

/* a JSON string as json.JSONEncoder(ensure_ascii=False) writes it */
static int json_string(Buf *out, const char *s, Py_ssize_t n) {
    static const char hex[] = "0123456789abcdef";
    if (buf_byte(out, '"') < 0) return -1;
    Py_ssize_t run = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        if (buf_put(out, s + run, i - run) < 0) return -1;
        run = i + 1;
        char esc[6] = {'\\', 0, 0, 0, 0, 0};
        int len = 2;
        switch (c) {
        case '"': esc[1] = '"'; break;
        case '\\': esc[1] = '\\'; break;
        case '\n': esc[1] = 'n'; break;
        case '\r': esc[1] = 'r'; break;
        case '\t': esc[1] = 't'; break;
        case '\b': esc[1] = 'b'; break;
        case '\f': esc[1] = 'f'; break;
        default:
            esc[1] = 'u'; esc[2] = '0'; esc[3] = '0'; esc[4] = hex[c >> 4]; esc[5] = hex[c & 15];
            len = 6;
        }
        if (buf_put(out, esc, len) < 0) return -1;
    }
    if (buf_put(out, s + run, n - run) < 0) return -1;
    return buf_byte(out, '"');
}

static int put_len(Buf *lens, Py_ssize_t n) {
    if (n > INT32_MAX) return fail("a value longer than 2 GiB");
    int32_t v = (int32_t)n;
    return buf_put(lens, &v, 4);
}

/* One value at p (at most end), appended to the column's buffers. Returns the bytes it took,
 * -1 on error. */
static Py_ssize_t value(Col *c, const unsigned char *p, const unsigned char *end) {
    Py_ssize_t avail = end - p, took;
    char text[96], *o = text;
#define NEED(n) do { if ((Py_ssize_t)(n) > avail) return fail("a row image runs past the end of its event"); } while (0)
    switch (c->code) {
    case K_INT: {
        int w = c->a;
        NEED(w);
        uint64_t u = le(p, w);
        int64_t v;
        if (!c->b && w < 8 && (u & (1ULL << (8 * w - 1)))) v = (int64_t)(u - (1ULL << (8 * w)));
        else v = (int64_t)u;
        return buf_put(&c->data, &v, 8) < 0 ? -1 : w;
    }
    case K_YEAR: {
        NEED(1);
        int64_t v = p[0] ? p[0] + 1900 : 0;  /* YEAR 0000 is stored as 0 */
        return buf_put(&c->data, &v, 8) < 0 ? -1 : 1;
    }
    case K_FLOAT:
        NEED(4);
        return buf_put(&c->data, p, 4) < 0 ? -1 : 4;
    case K_DOUBLE:
        NEED(8);
        return buf_put(&c->data, p, 8) < 0 ? -1 : 8;
    case K_DECIMAL: {
        Py_ssize_t size = decimal_size(c->a, c->b);
        NEED(size);
        Py_ssize_t at = c->data.len;
        if (decimal_text(p, c->a, c->b, &c->data) < 0 || put_len(&c->lens, c->data.len - at) < 0) return -1;
        return size;
    }
    case K_BIT: {
        int bits = c->a, n = (bits + 7) / 8;
        NEED(n);
        unsigned char first = p[0];
        if (bits % 8) first &= (unsigned char)((1 << (bits % 8)) - 1);
        uint64_t u = first;
        for (int i = 1; i < n; i++) u = (u << 8) | p[i];
        return buf_put(&c->data, &u, 8) < 0 ? -1 : n;
    }
    case K_STR: {
        int lb = c->a;
        NEED(lb);
        uint64_t n = le(p, lb);
        if (n > (uint64_t)(avail - lb)) return fail("a row image runs past the end of its event");
        Py_ssize_t at = c->data.len;
        if (buf_put(&c->data, p + lb, (Py_ssize_t)n) < 0) return -1;
        if (c->b && (Py_ssize_t)n < c->b) {  /* BINARY(n): the 0x00 padding the binlog drops */
            Py_ssize_t pad = c->b - (Py_ssize_t)n;
            if (buf_reserve(&c->data, pad) < 0) return -1;
            memset(c->data.p + c->data.len, 0, pad);
            c->data.len += pad;
        }
        return put_len(&c->lens, c->data.len - at) < 0 ? -1 : lb + (Py_ssize_t)n;
    }
    case K_ENUM: {
        NEED(c->a);
        uint64_t i = le(p, c->a);
        if (i >= (uint64_t)c->nnames) return fail("an ENUM index beyond the column's values");
        if (buf_put(&c->data, c->names[i], c->name_len[i]) < 0 || put_len(&c->lens, c->name_len[i]) < 0) return -1;
        return c->a;
    }
    case K_SET: {
        NEED(c->a);
        uint64_t bits = le(p, c->a);
        Py_ssize_t at = c->data.len;
        int first = 1;
        for (Py_ssize_t i = 0; i < c->nnames && i < 64; i++) {
            if (!(bits & (1ULL << i))) continue;
            if (!first && buf_byte(&c->data, ',') < 0) return -1;
            if (buf_put(&c->data, c->names[i], c->name_len[i]) < 0) return -1;
            first = 0;
        }
        return put_len(&c->lens, c->data.len - at) < 0 ? -1 : c->a;
    }
    case K_DATE: {  /* the day, month and year bits as the server's text, also of zero and partial dates */
        NEED(3);
        uint32_t v = (uint32_t)le(p, 3);
        o = ymd(o, (v >> 9) & 0x7FFF, (v >> 5) & 15, v & 31);
        took = 3;
        break;
    }
    case K_DATETIME2: {
        took = 5 + fsp_bytes(c->a);
        NEED(took);
        uint64_t v = be(p, 5);
        unsigned ym = (unsigned)((v >> 22) & 0x1FFFF);
        long us = fsp_micros(p + 5, c->a);
        if (us < 0) return fail("a negative DATETIME fraction");
        o = ymd(o, ym / 13, ym % 13, (v >> 17) & 31);
        *o++ = 'T';
        o = hmsf(o, (v >> 12) & 31, (v >> 6) & 63, v & 63, (uint64_t)us);
        break;
    }
    case K_TIMESTAMP2: {
        took = 4 + fsp_bytes(c->a);
        NEED(took);
        int64_t secs = (int32_t)be(p, 4);
        long us = fsp_micros(p + 4, c->a);
        if (us < 0) return fail("a negative TIMESTAMP fraction");
        if (secs == 0 && us == 0) {  /* epoch 0 is the zero timestamp (1970-01-01 00:00:00 UTC is outside the range) */
            memcpy(o, "0000-00-00T00:00:00.000000", 26);
            o += 26;
        } else {
            int64_t days = secs >= 0 ? secs / 86400 : -((-secs + 86399) / 86400);
            int64_t rem = secs - days * 86400, y;
            unsigned m, d;
            civil(days, &y, &m, &d);
            if (y < 1) return fail("a TIMESTAMP before year 1");
            o = ymd(o, (uint64_t)y, m, d);
            *o++ = 'T';
            o = hmsf(o, (uint64_t)(rem / 3600), (unsigned)(rem % 3600 / 60), (unsigned)(rem % 60), (uint64_t)us);
        }
        *o++ = 'Z';
        break;
    }
    case K_TIME2: {  /* MySQL's my_time_packed_from_binary, then TIME_from_longlong_time_packed */
        int fsp = c->a;
        took = 3 + fsp_bytes(fsp);
        NEED(took);
        int64_t packed;
        int64_t intpart = (int64_t)be(p, 3) - 0x800000;
        if (fsp == 1 || fsp == 2) {
            int64_t frac = p[3];
            if (intpart < 0 && frac) { intpart++; frac -= 0x100; }
            packed = intpart * (1LL << 24) + frac * 10000;
        } else if (fsp == 3 || fsp == 4) {
            int64_t frac = (int64_t)be(p + 3, 2);
            if (intpart < 0 && frac) { intpart++; frac -= 0x10000; }
            packed = intpart * (1LL << 24) + frac * 100;
        } else if (fsp == 5 || fsp == 6) {
            packed = (int64_t)be(p, 6) - 0x800000000000LL;
        } else {
            packed = intpart * (1LL << 24);
        }
        if (packed < 0) { *o++ = '-'; packed = -packed; }
        int64_t hms = packed >> 24;
        o = hmsf(o, (uint64_t)((hms >> 12) % (1 << 10)), (unsigned)((hms >> 6) % (1 << 6)), (unsigned)(hms % (1 << 6)),
                 (uint64_t)(packed % (1LL << 24)));
        break;
    }
    default:
        return fail("a column type the walker does not know");
    }
#undef NEED
    /* the temporal types: canonical text */
    Py_ssize_t tn = o - text;
    if (buf_put(&c->data, text, tn) < 0 || put_len(&c->lens, tn) < 0) return -1;
    return took;
}

/* A column's metadata comes from the server's TABLE_MAP (mysql-replication reads widths, BLOB
 * length sizes, precision, scale, fsp and ENUM/SET sizes as bytes, 0..255): outside its type's
 * domain, value() would read out of bounds, shift by a negative or too wide count, take no
 * bytes, or amplify one value into gigabytes. */
static int check_column(Py_ssize_t i, const Col *c) {
    int a = c->a, b = c->b, ok;
    switch (c->code) {
    case K_INT: ok = a == 1 || a == 2 || a == 3 || a == 4 || a == 8; break;
    case K_YEAR: case K_FLOAT: case K_DOUBLE: case K_DATE: ok = 1; break;
    case K_DECIMAL: ok = a >= 1 && a <= 65 && b >= 0 && b <= a; break;  /* DECIMAL(1..65, 0..M) */
    case K_BIT: ok = a >= 1 && a <= 64; break;
    case K_STR: ok = a >= 1 && a <= 4 && b >= 0 && b <= 255; break;     /* BINARY(n): n <= 255 */
    case K_ENUM: ok = a == 1 || a == 2; break;
    case K_SET: ok = a >= 1 && a <= 8; break;
    case K_DATETIME2: case K_TIMESTAMP2: case K_TIME2: ok = a >= 0 && a <= 6; break;
    default:
        PyErr_Format(PyExc_ValueError, "column %zd: a column type the walker does not know (%d)", i, c->code);
        return -1;
    }
    if (!ok) PyErr_Format(PyExc_ValueError, "column %zd: metadata out of range for its type (%d: %d, %d)", i, c->code, a, b);
    return ok ? 0 : -1;
}

static inline int fixed_width(int code) {
    return code == K_INT || code == K_YEAR || code == K_BIT || code == K_FLOAT || code == K_DOUBLE;
}

static int null_value(Col *c) {
    if (fixed_width(c->code)) {
        static const char zero[8] = {0};
        return buf_put(&c->data, zero, c->code == K_FLOAT ? 4 : 8);
    }
    return put_len(&c->lens, 0);
}

static PyObject *decode(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end;
    int kind;
    PyObject *spec, *keycols;
    if (!PyArg_ParseTuple(args, "y*nniOO", &view, &start, &end, &kind, &spec, &keycols)) return NULL;
    PyObject *result = NULL;
    Col *cols = NULL;
    Py_ssize_t ncols = 0, nkeys = 0;
    Py_ssize_t *keyidx = NULL;
    Buf ops = {0}, bidx = {0}, aidx = {0}, kdata = {0}, klens = {0}, key0 = {0}, key1 = {0};

    if (!PyTuple_Check(spec) || !PyTuple_Check(keycols)) { PyErr_SetString(PyExc_TypeError, "columns and key_columns are tuples"); goto done; }
    if (start < 0 || end > view.len || start > end) { PyErr_SetString(PyExc_ValueError, "start/end outside the data"); goto done; }
    if (kind < 0 || kind > 2) { PyErr_SetString(PyExc_ValueError, "kind is 0, 1 or 2"); goto done; }
    ncols = PyTuple_GET_SIZE(spec);
    nkeys = PyTuple_GET_SIZE(keycols);
    cols = PyMem_Calloc(ncols ? ncols : 1, sizeof(Col));
    keyidx = PyMem_Calloc(nkeys ? nkeys : 1, sizeof(Py_ssize_t));
    if (!cols || !keyidx) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < ncols; i++) {
        PyObject *t = PyTuple_GET_ITEM(spec, i), *names;
        Col *c = &cols[i];
        if (!PyTuple_Check(t)) { PyErr_SetString(PyExc_TypeError, "a column spec is a tuple"); goto done; }
        if (!PyArg_ParseTuple(t, "iiiiO", &c->code, &c->a, &c->b, &c->c, &names)) goto done;
        if (check_column(i, c) < 0) goto done;
        if (names != Py_None) {
            if (!PyTuple_Check(names)) { PyErr_SetString(PyExc_TypeError, "names is a tuple of bytes"); goto done; }
            c->nnames = PyTuple_GET_SIZE(names);
            c->names = PyMem_Calloc(c->nnames ? c->nnames : 1, sizeof(char *));
            c->name_len = PyMem_Calloc(c->nnames ? c->nnames : 1, sizeof(Py_ssize_t));
            if (!c->names || !c->name_len) { PyErr_NoMemory(); goto done; }
            for (Py_ssize_t j = 0; j < c->nnames; j++) {
                PyObject *nm = PyTuple_GET_ITEM(names, j);
                if (!PyBytes_Check(nm)) { PyErr_SetString(PyExc_TypeError, "names is a tuple of bytes"); goto done; }
                c->names[j] = PyBytes_AS_STRING(nm);
                c->name_len[j] = PyBytes_GET_SIZE(nm);
            }
        }
    }
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(keycols, k));
        if (i == -1 && PyErr_Occurred()) goto done;
        if (i < 0 || i >= ncols) { PyErr_SetString(PyExc_ValueError, "a key column out of range"); goto done; }
        keyidx[k] = i;
        cols[i].is_key = 1;
    }

    const unsigned char *data = (const unsigned char *)view.buf, *p = data + start, *stop = data + end;
    Py_ssize_t nullbytes = (ncols + 7) / 8, images = 0, events = 0;
    if (ncols == 0 && p < stop) { fail("row images of a table without columns"); goto done; }
    /* the key of an image: the key columns' values, in key order, as JSON */
    Buf *keys[2] = {&key0, &key1};
    while (p < stop) {
        int pair = kind == 1 ? 2 : 1;
        if (images > INT32_MAX - pair) { fail("more row images than an int32 numbers"); goto done; }
        for (int h = 0; h < pair; h++) {
            Buf *key = keys[h];
            key->len = 0;
            if (stop - p < nullbytes) { fail("a row image runs past the end of its event"); goto done; }
            const unsigned char *nulls = p;
            p += nullbytes;
            /* values first, in column order; the key after, in key order */
            for (Py_ssize_t i = 0; i < ncols; i++) {
                Col *c = &cols[i];
                int isnull = (nulls[i / 8] >> (i % 8)) & 1;
                if (buf_byte(&c->valid, (char)!isnull) < 0) goto done;
                if (isnull) {
                    if (null_value(c) < 0) goto done;
                    continue;
                }
                Py_ssize_t took = value(c, p, stop);
                if (took < 0) goto done;
                p += took;
            }
            /* the key: re-read the key columns' decoded values from the column buffers */
            if (buf_byte(key, '[') < 0) goto done;
            for (Py_ssize_t k = 0; k < nkeys; k++) {
                Col *c = &cols[keyidx[k]];
                if (k && buf_byte(key, ',') < 0) goto done;
                if (!c->valid.p[c->valid.len - 1]) { if (buf_put(key, "null", 4) < 0) goto done; continue; }
                char text[40];
                switch (c->code) {
                case K_INT: case K_YEAR: case K_BIT: {
                    int64_t v;
                    memcpy(&v, c->data.p + c->data.len - 8, 8);
                    int uns = c->code == K_BIT || (c->code == K_INT && c->b);
                    char *e = uns ? utoa(text, (uint64_t)v) : itoa64(text, v);
                    if (buf_put(key, text, e - text) < 0) goto done;
                    break;
                }
                case K_FLOAT: case K_DOUBLE:
                    fail("a FLOAT or DOUBLE key column");
                    goto done;
                default: {
                    int32_t len;
                    memcpy(&len, c->lens.p + c->lens.len - 4, 4);
                    const char *s = c->data.p + c->data.len - len;
                    if (c->code == K_STR && c->c) {
                        if (buf_byte(key, '"') < 0 || base64(key, (const unsigned char *)s, len) < 0 || buf_byte(key, '"') < 0)
                            goto done;
                    } else if (json_string(key, s, len) < 0) goto done;
                }
                }
            }
            if (buf_byte(key, ']') < 0) goto done;
            images++;
        }
        /* the row's events */
        int32_t none = -1, b, a;
        if (kind == 0) {
            a = (int32_t)(images - 1);
            if (buf_byte(&ops, 0) < 0 || buf_put(&bidx, &none, 4) < 0 || buf_put(&aidx, &a, 4) < 0
                || buf_put(&kdata, key0.p, key0.len) < 0 || put_len(&klens, key0.len) < 0) goto done;
            events++;
        } else if (kind == 2) {
            b = (int32_t)(images - 1);
            if (buf_byte(&ops, 2) < 0 || buf_put(&bidx, &b, 4) < 0 || buf_put(&aidx, &none, 4) < 0
                || buf_put(&kdata, key0.p, key0.len) < 0 || put_len(&klens, key0.len) < 0) goto done;
            events++;
        } else {
            b = (int32_t)(images - 2);
            a = (int32_t)(images - 1);
            if (key0.len == key1.len && memcmp(key0.p, key1.p, key0.len) == 0) {
                if (buf_byte(&ops, 1) < 0 || buf_put(&bidx, &b, 4) < 0 || buf_put(&aidx, &a, 4) < 0
                    || buf_put(&kdata, key1.p, key1.len) < 0 || put_len(&klens, key1.len) < 0) goto done;
                events++;
            } else {  /* a key change: the delete of the old key, then the create of the new one */
                if (buf_byte(&ops, 2) < 0 || buf_put(&bidx, &b, 4) < 0 || buf_put(&aidx, &none, 4) < 0
                    || buf_put(&kdata, key0.p, key0.len) < 0 || put_len(&klens, key0.len) < 0) goto done;
                if (buf_byte(&ops, 0) < 0 || buf_put(&bidx, &none, 4) < 0 || buf_put(&aidx, &a, 4) < 0
                    || buf_put(&kdata, key1.p, key1.len) < 0 || put_len(&klens, key1.len) < 0) goto done;
                events += 2;
            }
        }
    }
    {
        PyObject *colout = PyList_New(ncols);
        if (!colout) goto done;
        for (Py_ssize_t i = 0; i < ncols; i++) {
            Col *c = &cols[i];
            PyObject *lens = fixed_width(c->code) ? (Py_INCREF(Py_None), Py_None) : buf_bytes(&c->lens);
            PyObject *t = lens ? Py_BuildValue("(NNN)", buf_bytes(&c->valid), buf_bytes(&c->data), lens) : NULL;
            if (!t) { Py_DECREF(colout); goto done; }
            PyList_SET_ITEM(colout, i, t);
        }
        result = Py_BuildValue("(nNNNNNN)", images, buf_bytes(&ops), buf_bytes(&bidx), buf_bytes(&aidx),
                               buf_bytes(&kdata), buf_bytes(&klens), colout);
    }
done:
    PyBuffer_Release(&view);
    if (cols) {
        for (Py_ssize_t i = 0; i < ncols; i++) {
            PyMem_Free(cols[i].names);
            PyMem_Free(cols[i].name_len);
            buf_free(&cols[i].valid);
            buf_free(&cols[i].data);
            buf_free(&cols[i].lens);
        }
        PyMem_Free(cols);
    }
    PyMem_Free(keyidx);
    buf_free(&ops); buf_free(&bidx); buf_free(&aidx); buf_free(&kdata); buf_free(&klens);
    buf_free(&key0); buf_free(&key1);
    return result;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "decode(data, start, end, kind, columns, key_columns) -> columns and events"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rows", "The compiled binlog rows walker.", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
