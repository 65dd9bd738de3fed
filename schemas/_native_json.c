/* JSON objects with a flat schema (integers, doubles, booleans, strings) read into Arrow buffers in C, one
 * pass over each payload and no Python object per value. schemas/native_json.py is its Python face and says
 * when it is used.
 *
 * It is a fast path, never a second judge: it takes a batch only when every payload is a JSON object that
 * the reference path (Arrow's JSON reader behind orjson-strict checks, schemas/json_format.py) reads to the
 * same values, and hands back None for the whole batch at the first thing it does not handle: a payload that
 * is not strict JSON, a value of another type than its field's, a schema field given twice, an escape in a
 * key, a lone surrogate, invalid UTF-8, an integer beyond 64 bits, a number beyond the double range, nesting
 * deeper than MAX_SKIP_DEPTH in an ignored member. The reference path then decodes that batch and gives the
 * verdicts and reasons, so a payload's verdict does not depend on which path read it.
 *
 * Values read as the reference reads them: a missing member or `null` is a null; members not in the schema
 * are skipped (checked, not kept); a double field takes integers too; doubles are correctly rounded (exact
 * arithmetic when the decimal fits in 15 digits and a power of ten up to 1e22, Python's correctly rounded
 * strtod otherwise); strings are unescaped to UTF-8. Nulls in required fields are the caller's to find.
 */
#include "_native_arrow.h"

#include <math.h>
#include <stdio.h>

#define MAX_FIELDS 256
#define MAX_SKIP_DEPTH 64
#define MAX_NUMBER_CHARS 64

enum kind { KIND_INT64 = 'i', KIND_DOUBLE = 'd', KIND_BOOL = 'b', KIND_STRING = 's', KIND_TIMESTAMP = 't' };

typedef struct {
    char kind;
    const char *name;
    Py_ssize_t name_len;
} Field;

/* The fields to read and, at the same index, the Arrow array each fills. */
typedef struct {
    Field fields[MAX_FIELDS];
    ArrayOut outs[MAX_FIELDS];
    int count;
    Py_ssize_t rows;
    int failed; /* out of memory */
} Plan;

static ArrayOut *out_of(Plan *plan, const Field *f) { return &plan->outs[f - plan->fields]; }

static void set_null(Plan *plan, Field *f, Py_ssize_t row) {
    if (!array_out_set_null(out_of(plan, f), plan->rows, row)) plan->failed = 1;
}

static void skip_whitespace(Cursor *c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++;
}

static int literal(Cursor *c, const char *word, size_t n) {
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0) return 0;
    c->p += n;
    return 1;
}

static int hex4(const unsigned char *p, uint32_t *value) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char h = p[i];
        v <<= 4;
        if (h >= '0' && h <= '9') v |= h - '0';
        else if (h >= 'a' && h <= 'f') v |= h - 'a' + 10;
        else if (h >= 'A' && h <= 'F') v |= h - 'A' + 10;
        else return 0;
    }
    *value = v;
    return 1;
}

static size_t put_utf8(unsigned char *out, uint32_t code) {
    if (code < 0x80) {
        out[0] = (unsigned char)code;
        return 1;
    }
    if (code < 0x800) {
        out[0] = (unsigned char)(0xC0 | (code >> 6));
        out[1] = (unsigned char)(0x80 | (code & 0x3F));
        return 2;
    }
    if (code < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (code >> 12));
        out[1] = (unsigned char)(0x80 | ((code >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (code & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (code >> 18));
    out[1] = (unsigned char)(0x80 | ((code >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((code >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (code & 0x3F));
    return 4;
}

/* A string from after its opening quote to after its closing one, its text unescaped to `out` when given
 * (room for as many bytes as the source has: unescaping never lengthens). 0 when it is not one we take. */
static int read_string(Cursor *c, unsigned char *out, size_t *written) {
    size_t n = 0;
    while (c->p < c->end) {
        const unsigned char *run = c->p;
        while (c->p < c->end && *c->p >= 0x20 && *c->p < 0x80 && *c->p != '"' && *c->p != '\\') c->p++;
        if (out && c->p > run) {
            memcpy(out + n, run, (size_t)(c->p - run));
            n += (size_t)(c->p - run);
        }
        if (c->p >= c->end) return 0;
        unsigned char b = *c->p;
        if (b == '"') {
            c->p++;
            if (written) *written = n;
            return 1;
        }
        if (b < 0x20) return 0; /* a raw control character */
        if (b >= 0x80) {
            int len = utf8_sequence(c->p, c->end);
            if (!len) return 0;
            if (out) memcpy(out + n, c->p, (size_t)len);
            n += (size_t)len;
            c->p += len;
            continue;
        }
        /* an escape */
        if (c->end - c->p < 2) return 0;
        unsigned char e = c->p[1];
        c->p += 2;
        unsigned char simple = e == '"' ? '"' : e == '\\' ? '\\' : e == '/' ? '/' : e == 'b' ? '\b'
                             : e == 'f' ? '\f' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 't' ? '\t' : 0;
        if (simple) {
            if (out) out[n] = simple;
            n++;
            continue;
        }
        uint32_t code, low;
        if (e != 'u' || c->end - c->p < 4 || !hex4(c->p, &code)) return 0;
        c->p += 4;
        if (code >= 0xDC00 && code <= 0xDFFF) return 0; /* a lone low surrogate */
        if (code >= 0xD800 && code <= 0xDBFF) {
            if (c->end - c->p < 6 || c->p[0] != '\\' || c->p[1] != 'u' || !hex4(c->p + 2, &low) || low < 0xDC00 ||
                low > 0xDFFF)
                return 0; /* a high surrogate without its low half */
            c->p += 6;
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
        }
        unsigned char encoded[4];
        size_t len = put_utf8(encoded, code);
        if (out) memcpy(out + n, encoded, len);
        n += len;
    }
    return 0;
}

static const double EXACT_POWERS[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                      1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number. Sets *is_integer (no fraction, no exponent), the integer and *integer_fits when it is
 * one (fits int64), and the correctly rounded double. 0 when the text is not a JSON number, has more than 19
 * integer digits, an exponent of more than 4 digits, or a double beyond the finite range. */
static int read_number(Cursor *c, int *is_integer, int64_t *integer, int *integer_fits, double *number) {
    const unsigned char *start = c->p, *p = c->p;
    int negative = 0, significant = 0, inexact = 0, scale = 0, exponent = 0, exponent_sign = 1, digits = 0;
    uint64_t mantissa = 0;
    *is_integer = 1;
    if (p < c->end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= c->end || *p < '0' || *p > '9') return 0;
    if (*p == '0' && p + 1 < c->end && p[1] >= '0' && p[1] <= '9') return 0; /* a leading zero */
    for (; p < c->end && *p >= '0' && *p <= '9'; p++) {
        if (++digits > 19) return 0;
        mantissa = mantissa * 10 + (uint64_t)(*p - '0');
    }
    significant = mantissa ? digits : 0;
    if (p < c->end && *p == '.') {
        *is_integer = 0;
        if (++p >= c->end || *p < '0' || *p > '9') return 0;
        for (; p < c->end && *p >= '0' && *p <= '9'; p++) {
            if (significant >= 19) {
                inexact = 1; /* digits beyond a uint64: left to strtod */
                continue;
            }
            mantissa = mantissa * 10 + (uint64_t)(*p - '0');
            scale--;
            if (mantissa) significant++;
        }
    }
    if (p < c->end && (*p == 'e' || *p == 'E')) {
        *is_integer = 0;
        p++;
        if (p < c->end && (*p == '+' || *p == '-')) exponent_sign = *p++ == '-' ? -1 : 1;
        if (p >= c->end || *p < '0' || *p > '9') return 0;
        for (digits = 0; p < c->end && *p >= '0' && *p <= '9'; p++) {
            if (++digits > 4) return 0;
            exponent = exponent * 10 + (*p - '0');
        }
    }
    c->p = p;
    if (*is_integer) {
        *integer_fits = mantissa <= (negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX);
        *integer = *integer_fits ? (negative ? (int64_t)(0 - mantissa) : (int64_t)mantissa) : 0;
    }
    scale += exponent_sign * exponent;
    if (!inexact && (mantissa == 0 || (significant <= 15 && scale >= -22 && scale <= 22))) {
        /* both operands exact, so the one operation rounds correctly (Clinger's fast path) */
        double value = (double)mantissa;
        if (mantissa) value = scale < 0 ? value / EXACT_POWERS[-scale] : value * EXACT_POWERS[scale];
        *number = negative ? -value : value;
        return 1;
    }
    if (p - start >= MAX_NUMBER_CHARS) return 0;
    char text[MAX_NUMBER_CHARS];
    memcpy(text, start, (size_t)(p - start));
    text[p - start] = 0;
    double value = PyOS_string_to_double(text, NULL, NULL);
    if (value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    if (!isfinite(value)) return 0;
    *number = value;
    return 1;
}

/* Any JSON value, checked and not kept; 0 when it is not one we take. */
static int skip_value(Cursor *c, int depth) {
    if (depth > MAX_SKIP_DEPTH || c->p >= c->end) return 0;
    unsigned char b = *c->p;
    if (b == '"') {
        c->p++;
        return read_string(c, NULL, NULL);
    }
    if (b == '{' || b == '[') {
        unsigned char close = b == '{' ? '}' : ']';
        c->p++;
        skip_whitespace(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return 1;
        }
        for (;;) {
            if (b == '{') {
                if (c->p >= c->end || *c->p != '"') return 0;
                c->p++;
                if (!read_string(c, NULL, NULL)) return 0;
                skip_whitespace(c);
                if (c->p >= c->end || *c->p != ':') return 0;
                c->p++;
                skip_whitespace(c);
            }
            if (!skip_value(c, depth + 1)) return 0;
            skip_whitespace(c);
            if (c->p >= c->end) return 0;
            if (*c->p == close) {
                c->p++;
                return 1;
            }
            if (*c->p != ',') return 0;
            c->p++;
            skip_whitespace(c);
        }
    }
    if (literal(c, "true", 4) || literal(c, "false", 5) || literal(c, "null", 4)) return 1;
    int is_integer, fits;
    int64_t integer;
    double number;
    return read_number(c, &is_integer, &integer, &fits, &number);
}

/* The value of `f` in row `row`; 0 when it is not one we take. */
static int read_field_value(Plan *plan, Field *f, Cursor *c, Py_ssize_t row) {
    Text *values = &out_of(plan, f)->values;
    if (literal(c, "null", 4)) {
        set_null(plan, f, row);
        return !plan->failed;
    }
    switch (f->kind) {
    case KIND_BOOL:
        if (literal(c, "true", 4)) values->data[row / 8] |= (char)(1u << (row % 8));
        else if (!literal(c, "false", 5)) return 0;
        return 1;
    case KIND_STRING: {
        if (c->p >= c->end || *c->p != '"') return 0;
        c->p++;
        char *at = room(values, (size_t)(c->end - c->p));
        if (!at) {
            plan->failed = values->out_of_memory; /* else beyond int32 offsets: the reference path reads it */
            return 0;
        }
        size_t written;
        if (!read_string(c, (unsigned char *)at, &written)) return 0;
        values->size += written;
        return 1;
    }
    default: {
        int is_integer, fits;
        int64_t integer;
        double number;
        if (!read_number(c, &is_integer, &integer, &fits, &number)) return 0;
        if (f->kind == KIND_INT64) {
            if (!is_integer || !fits) return 0;
            memcpy(values->data + 8 * row, &integer, 8);
        } else {
            if (is_integer && !fits) return 0;
            memcpy(values->data + 8 * row, &number, 8);
        }
        return 1;
    }
    }
}

static Field *find_field(Plan *plan, const unsigned char *key, size_t n, int *hint) {
    for (int i = 0; i < plan->count; i++) {
        int at = (*hint + i) % plan->count;
        Field *f = &plan->fields[at];
        if ((size_t)f->name_len == n && memcmp(f->name, key, n) == 0) {
            *hint = at + 1;
            return f;
        }
    }
    return NULL;
}

/* One payload into row `row` of every field; 0 when it is not one we take. */
static int read_object(Plan *plan, Cursor *c, Py_ssize_t row) {
    uint8_t seen[MAX_FIELDS] = {0};
    int hint = 0;
    skip_whitespace(c);
    if (c->p >= c->end || *c->p != '{') return 0;
    c->p++;
    skip_whitespace(c);
    if (c->p < c->end && *c->p == '}') c->p++;
    else
        for (;;) {
            if (c->p >= c->end || *c->p != '"') return 0;
            const unsigned char *key = ++c->p;
            while (c->p < c->end && *c->p != '"' && *c->p != '\\' && *c->p >= 0x20 && *c->p < 0x80) c->p++;
            if (c->p >= c->end || *c->p != '"') return 0; /* an escape or non-ASCII in a key: not here */
            size_t key_len = (size_t)(c->p - key);
            c->p++;
            skip_whitespace(c);
            if (c->p >= c->end || *c->p != ':') return 0;
            c->p++;
            skip_whitespace(c);
            Field *f = find_field(plan, key, key_len, &hint);
            if (f) {
                int index = (int)(f - plan->fields);
                if (seen[index]++) return 0; /* a field given twice */
                if (!read_field_value(plan, f, c, row)) return 0;
            } else if (!skip_value(c, 1)) return 0;
            skip_whitespace(c);
            if (c->p >= c->end) return 0;
            if (*c->p == '}') {
                c->p++;
                break;
            }
            if (*c->p != ',') return 0;
            c->p++;
            skip_whitespace(c);
        }
    skip_whitespace(c);
    if (c->p != c->end) return 0;
    for (int i = 0; i < plan->count; i++) {
        Field *f = &plan->fields[i];
        if (!seen[i]) set_null(plan, f, row);
        array_out_end_row(out_of(plan, f), row);
    }
    return !plan->failed;
}

static int plan_start(Plan *plan, PyObject *names, const char *kinds, Py_ssize_t rows) {
    memset(plan, 0, sizeof(*plan));
    plan->rows = rows;
    plan->count = (int)PyTuple_GET_SIZE(names);
    for (int i = 0; i < plan->count; i++) {
        Field *f = &plan->fields[i];
        f->kind = kinds[i];
        f->name = PyBytes_AS_STRING(PyTuple_GET_ITEM(names, i));
        f->name_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(names, i));
        int width = f->kind == KIND_STRING ? VARIABLE_WIDTH : f->kind == KIND_BOOL ? 0 : 8;
        if (array_out_start(&plan->outs[i], rows, width) < 0) return -1;
    }
    return 0;
}

/* decode(data, offsets, first, rows, names, kinds) -> [(validity, values, offsets, nulls)] per field, or
 * None when a payload is not one this path takes. `data` and `offsets` are the buffers of an Arrow binary
 * array without nulls, `first` its offset; `names` a tuple of bytes, `kinds` one of "idbs" per name. */
static PyObject *decode(PyObject *module, PyObject *args) {
    Py_buffer data, offsets;
    Py_ssize_t first, rows;
    PyObject *names;
    const char *kinds;
    Py_ssize_t kinds_len;
    (void)module;
    if (!PyArg_ParseTuple(args, "y*y*nnO!s#", &data, &offsets, &first, &rows, &PyTuple_Type, &names, &kinds,
                          &kinds_len))
        return NULL;
    PyObject *result = NULL;
    Plan *plan = NULL;
    if (kinds_len != PyTuple_GET_SIZE(names) || kinds_len > MAX_FIELDS) {
        PyErr_SetString(PyExc_ValueError, "decode: the names and kinds do not agree");
        goto done;
    }
    if (!payloads_bounded(&data, &offsets, first, rows)) goto done;
    for (Py_ssize_t i = 0; i < kinds_len; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(names, i)) || !strchr("idbs", kinds[i])) {
            PyErr_SetString(PyExc_ValueError, "decode: names must be bytes and kinds one of 'idbs'");
            goto done;
        }
    plan = malloc(sizeof(Plan));
    if (!plan || plan_start(plan, names, kinds, rows) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        Cursor c = payload(&data, &offsets, first, row);
        if (!read_object(plan, &c, row)) {
            if (plan->failed) PyErr_NoMemory();
            else result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = arrays_out_buffers(plan->outs, plan->count, plan->rows);
done:
    if (plan) {
        arrays_out_free(plan->outs, plan->count);
        free(plan);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    return result;
}

/* ------------------------------------------------------------------------------------------ writing */

/* A JSON string as DuckDB's to_json writes it: `"` `\` and the control characters escaped (\b \f \n \r \t,
 * the others as \u00XX in upper-case hex), everything else (DEL, non-ASCII UTF-8, '/') as it is. */
static void put_string(Text *t, const unsigned char *s, size_t n) {
    char *at = room(t, 6 * n + 2);
    if (!at) return;
    char *out = at;
    *out++ = '"';
    for (size_t i = 0; i < n; i++) {
        unsigned char b = s[i];
        if (b >= 0x20 && b != '"' && b != '\\') {
            *out++ = (char)b;
            continue;
        }
        *out++ = '\\';
        switch (b) {
        case '"': *out++ = '"'; break;
        case '\\': *out++ = '\\'; break;
        case '\b': *out++ = 'b'; break;
        case '\f': *out++ = 'f'; break;
        case '\n': *out++ = 'n'; break;
        case '\r': *out++ = 'r'; break;
        case '\t': *out++ = 't'; break;
        default:
            memcpy(out, "u00", 3);
            out[3] = "0123456789ABCDEF"[b >> 4];
            out[4] = "0123456789ABCDEF"[b & 15];
            out += 5;
        }
    }
    *out++ = '"';
    t->size += (size_t)(out - at);
}

/* The shortest decimal digits that read back to `a` (finite, > 0), and the decimal point's place (a = 0.digits
 * x 10^point), when a k-fraction-digit decimal r / 10^k with r < 2^52 reads back to it: the division of
 * two exact doubles rounds as strtod rounds that decimal, and below 2^52 only one such r is near enough, so
 * the smallest such k gives Python's repr digits. Else 0 (the caller asks Python's repr). */
static int short_decimal(double a, char *digits, int *n, int *point) {
    for (int k = 0; k <= 22; k++) {
        double scaled = a * EXACT_POWERS[k];
        if (scaled >= 4503599627370496.0) return 0; /* 2^52 */
        double floor_ = floor(scaled);
        for (double r = floor_; r <= floor_ + 1; r++) {
            if (r == 0 || r / EXACT_POWERS[k] != a) continue;
            char reversed[24];
            int count = 0;
            for (uint64_t whole = (uint64_t)r; whole; whole /= 10) reversed[count++] = (char)('0' + whole % 10);
            for (int i = 0; i < count; i++) digits[i] = reversed[count - 1 - i];
            *n = count;
            *point = count - k;
            return 1;
        }
    }
    return 0;
}

/* Python's repr digits of `a` (finite, > 0) and the decimal point's place, as short_decimal gives them. 0
 * with an exception set when Python's formatter fails. */
static int repr_digits(double a, char *digits, int *n, int *point) {
    char *repr = PyOS_double_to_string(a, 'r', 0, 0, NULL);
    if (!repr) return 0;
    int seen_point = 0;
    const char *p = repr;
    *n = *point = 0;
    for (; *p && *p != 'e'; p++) {
        if (*p == '.') seen_point = 1;
        else if (*n == 0 && *p == '0') *point -= seen_point; /* a leading zero */
        else {
            if (*n < 32) digits[(*n)++] = *p;
            *point += !seen_point;
        }
    }
    if (*p == 'e') *point += atoi(p + 1);
    PyMem_Free(repr);
    return 1;
}

/* A finite double as DuckDB's to_json writes it: the shortest digits that read back to it (Python's repr
 * digits), in plain notation with at least one fraction digit when its decimal exponent is -6 to 20
 * (`0.000001`, `100.0`), else as `1.5e21` / `1e-7`. 0 with an exception set when Python's formatter fails. */
static int put_double(Text *t, double value) {
    char digits[32], out[64];
    int n = 0, point = 0, length = 0, negative = signbit(value) != 0;
    double a = fabs(value);
    if (a == 0) {
        put(t, negative ? "-0.0" : "0.0", negative ? 4 : 3);
        return 1;
    }
    if (!short_decimal(a, digits, &n, &point) && !repr_digits(a, digits, &n, &point)) return 0;
    while (n > 1 && digits[n - 1] == '0') n--;
    int scientific = point - 1;
    if (negative) out[length++] = '-';
    if (scientific >= -6 && scientific <= 20) {
        if (point <= 0) {
            out[length++] = '0';
            out[length++] = '.';
            for (int i = 0; i < -point; i++) out[length++] = '0';
            memcpy(out + length, digits, (size_t)n);
            length += n;
        } else if (point >= n) {
            memcpy(out + length, digits, (size_t)n);
            length += n;
            for (int i = n; i < point; i++) out[length++] = '0';
            out[length++] = '.';
            out[length++] = '0';
        } else {
            memcpy(out + length, digits, (size_t)point);
            length += point;
            out[length++] = '.';
            memcpy(out + length, digits + point, (size_t)(n - point));
            length += n - point;
        }
    } else {
        out[length++] = digits[0];
        if (n > 1) {
            out[length++] = '.';
            memcpy(out + length, digits + 1, (size_t)(n - 1));
            length += n - 1;
        }
        length += snprintf(out + length, sizeof(out) - (size_t)length, "e%d", scientific);
    }
    put(t, out, (size_t)length);
    return 1;
}

static void put_int64(Text *t, int64_t value) {
    char reversed[24];
    int count = 0;
    uint64_t magnitude = value < 0 ? 0 - (uint64_t)value : (uint64_t)value;
    do reversed[count++] = (char)('0' + magnitude % 10);
    while (magnitude /= 10);
    if (value < 0) reversed[count++] = '-';
    char *at = room(t, (size_t)count);
    if (!at) return;
    for (int i = 0; i < count; i++) at[i] = reversed[count - 1 - i];
    t->size += (size_t)count;
}

/* `value` (>= 0, below 10^width) as exactly `width` decimal digits; returns `width`. */
static int put_digits(char *out, int64_t value, int width) {
    for (int i = width - 1; i >= 0; i--, value /= 10) out[i] = (char)('0' + value % 10);
    return width;
}

static int64_t floor_div(int64_t a, int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); }

/* A timestamp as schemas.json_wire writes it (Arrow's cast to string, 'T' between date and time, 'Z' when
 * zoned): `"2025-11-24T16:00:00.000Z"`, as many fraction digits as the unit has. The caller keeps the years
 * to 1-9999. Days to a civil date by Howard Hinnant's algorithm (proleptic Gregorian). */
static void put_timestamp(Text *t, int64_t ticks, int fraction_digits, int zoned) {
    static const int64_t per_second[] = {1, 0, 0, 1000, 0, 0, 1000000, 0, 0, 1000000000};
    int64_t unit = per_second[fraction_digits];
    int64_t seconds = floor_div(ticks, unit), fraction = ticks - seconds * unit;
    int64_t days = floor_div(seconds, 86400), of_day = seconds - days * 86400;
    int64_t z = days + 719468, era = floor_div(z, 146097);
    int64_t day_of_era = z - era * 146097;
    int64_t year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
    int64_t day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    int64_t shifted_month = (5 * day_of_year + 2) / 153;
    int64_t day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    int64_t month = shifted_month < 10 ? shifted_month + 3 : shifted_month - 9;
    int64_t year = year_of_era + era * 400 + (month <= 2);
    char out[48];
    int length = 0;
    out[length++] = '"';
    length += put_digits(out + length, year, 4);
    out[length++] = '-';
    length += put_digits(out + length, month, 2);
    out[length++] = '-';
    length += put_digits(out + length, day, 2);
    out[length++] = 'T';
    length += put_digits(out + length, of_day / 3600, 2);
    out[length++] = ':';
    length += put_digits(out + length, of_day / 60 % 60, 2);
    out[length++] = ':';
    length += put_digits(out + length, of_day % 60, 2);
    if (fraction_digits) {
        out[length++] = '.';
        length += put_digits(out + length, fraction, fraction_digits);
    }
    if (zoned) out[length++] = 'Z';
    out[length++] = '"';
    put(t, out, (size_t)length);
}

/* A column to write: its kind, name and Arrow array. */
typedef struct {
    char kind;
    int fraction_digits, zoned; /* timestamps: the unit's fraction digits (0, 3, 6, 9), 'Z' or not */
    const char *name;
    Py_ssize_t name_len;
    ArrayIn in;
} Source;

/* A column is (name, kind, validity or None, values, offsets or None, first row). */
static int source_open(Source *s, PyObject *column, Py_ssize_t rows) {
    PyObject *name, *validity, *offsets;
    const char *kind;
    memset(s, 0, sizeof(*s));
    if (!PyArg_ParseTuple(column, "SsOy*On", &name, &kind, &validity, &s->in.values, &offsets, &s->in.first))
        return -1;
    s->kind = kind[0];
    int known = s->kind && strchr("idbst", s->kind) &&
                (s->kind != KIND_TIMESTAMP || (strlen(kind) >= 2 && strchr("0369", kind[1])));
    if (!known) {
        PyErr_SetString(PyExc_ValueError, "encode: a column's kind is not one of 'idbs' or 't' + digits");
        return -1;
    }
    if (s->kind == KIND_TIMESTAMP) {
        s->fraction_digits = kind[1] - '0';
        s->zoned = kind[2] == 'Z';
    }
    s->name = PyBytes_AS_STRING(name);
    s->name_len = PyBytes_GET_SIZE(name);
    return array_in_open(&s->in, validity, offsets, rows,
                         s->kind == KIND_STRING ? VARIABLE_WIDTH : s->kind == KIND_BOOL ? 0 : 8);
}

static int put_value(Text *t, const Source *s, Py_ssize_t row) {
    if (array_in_is_null(&s->in, row)) {
        put(t, "null", 4);
        return 1;
    }
    row += s->in.first;
    switch (s->kind) {
    case KIND_BOOL:
        if (((const uint8_t *)s->in.values.buf)[row / 8] & (1u << (row % 8))) put(t, "true", 4);
        else put(t, "false", 5);
        return 1;
    case KIND_STRING: {
        const int32_t *bounds = (const int32_t *)s->in.offsets.buf + row;
        put_string(t, (const unsigned char *)s->in.values.buf + bounds[0], (size_t)(bounds[1] - bounds[0]));
        return 1;
    }
    case KIND_INT64:
    case KIND_TIMESTAMP: {
        int64_t value;
        memcpy(&value, (const char *)s->in.values.buf + 8 * row, 8);
        if (s->kind == KIND_INT64) put_int64(t, value);
        else put_timestamp(t, value, s->fraction_digits, s->zoned);
        return 1;
    }
    default: {
        double value;
        memcpy(&value, (const char *)s->in.values.buf + 8 * row, 8);
        if (!isfinite(value)) {
            put(t, "null", 4);
            return 1;
        }
        return put_double(t, value);
    }
    }
}

/* encode(rows, columns) -> (data, offsets) of a binary array, one JSON object per row, or None when the text
 * would pass int32 offsets. `columns` is a list of (name as bytes, kind, validity or None, values, offsets or
 * None, first row) of Arrow arrays of kinds "idbs" or "t" + fraction digits (+ "Z" when zoned) for int64
 * timestamps, written in that order as DuckDB's to_json writes them (non-finite doubles as null). */
static PyObject *encode(PyObject *module, PyObject *args) {
    Py_ssize_t rows;
    PyObject *columns;
    (void)module;
    if (!PyArg_ParseTuple(args, "nO!", &rows, &PyList_Type, &columns)) return NULL;
    Py_ssize_t count = PyList_GET_SIZE(columns);
    Source *sources = calloc((size_t)(count ? count : 1), sizeof(Source));
    RowsOut out;
    PyObject *result = NULL;
    if (rows_out_start(&out, rows) < 0 || !sources) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (source_open(&sources[i], PyList_GET_ITEM(columns, i), rows) < 0) goto done;
    for (Py_ssize_t row = 0; row < rows && rows_out_open(&out); row++) {
        for (Py_ssize_t i = 0; i < count; i++) {
            put(&out.data, i ? "," : "{", 1);
            put_string(&out.data, (const unsigned char *)sources[i].name, (size_t)sources[i].name_len);
            put(&out.data, ":", 1);
            if (!put_value(&out.data, &sources[i], row)) goto done;
        }
        put(&out.data, count ? "}" : "{}", count ? 1 : 2);
        rows_out_end_row(&out, row);
    }
    result = rows_out_result(&out, rows);
done:
    if (sources) /* zeroed: a source not opened holds nothing to release */
        for (Py_ssize_t i = 0; i < count; i++) array_in_close(&sources[i].in);
    free(sources);
    rows_out_free(&out);
    return result;
}

static PyMethodDef module_methods[] = {
    {"decode", decode, METH_VARARGS, "read flat JSON objects into Arrow buffers, or None"},
    {"encode", encode, METH_VARARGS, "write Arrow columns as JSON objects, one per row"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "schemas._native_json", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__native_json(void) { return PyModule_Create(&module_def); }
