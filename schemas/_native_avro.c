/* Avro records of primitive fields read into and written from Arrow buffers in C, one pass over each payload
 * and no Python object per value. schemas/avro_columns.py is its Python face and says when it is used.
 *
 * A field is one of the kinds "b" boolean, "i" int, "l" long, "f" float, "d" double, "s" string, "y" bytes,
 * bare or in a union with null (where null is branch 0 or 1). Reading is an exact shortcut, never a second
 * judge: it hands back None for the whole batch at the first payload that is not exactly a record of the
 * fields after the expected prefix (bytes left over or missing, a varint longer than 64 bits, an int beyond 32
 * bits, a boolean byte other than 0 or 1, a union branch other than the two, a negative length, invalid
 * UTF-8 in a string, more string bytes than int32 offsets address), and the caller reads that batch record by
 * record with fastavro, which names each bad record's problem. Writing writes what fastavro writes: zigzag
 * varints, little-endian floats and doubles, a length before each string's bytes.
 */
#include "_native_arrow.h"

#define MAX_FIELDS 256
#define VARINT_BYTES 10 /* a 64-bit value needs at most ten 7-bit groups */
#define NOT_NULLABLE (-1)

static const unsigned char BRANCH_BYTE[2] = {0x00, 0x02}; /* union branches 0 and 1 as zigzag varints */

/* Bytes per value in the Arrow data buffer, by kind: 0 for a bitmap, VARIABLE_WIDTH for strings and bytes. */
static int width_of(char kind) {
    switch (kind) {
    case 'b':
        return 0;
    case 'i':
    case 'f':
        return 4;
    case 'l':
    case 'd':
        return 8;
    default:
        return VARIABLE_WIDTH;
    }
}

static int64_t unzigzag(uint64_t n) { return (int64_t)(n >> 1) ^ -(int64_t)(n & 1); }

static uint64_t zigzag(int64_t n) { return ((uint64_t)n << 1) ^ (uint64_t)(n >> 63); }

/* ------------------------------------------------------------------------------------------ reading */

typedef struct {
    char kind;
    int null_branch;
} Column;

/* The fields to read and, at the same index, the Arrow array each fills. */
typedef struct {
    Column columns[MAX_FIELDS];
    ArrayOut outs[MAX_FIELDS];
    int count;
    Py_ssize_t rows;
    int failed; /* out of memory */
} Reading;

static int read_varint(Cursor *c, uint64_t *value) {
    uint64_t v = 0;
    for (int group = 0; group < VARINT_BYTES; group++) {
        if (c->p >= c->end) return 0;
        unsigned char byte = *c->p++;
        if (group == VARINT_BYTES - 1 && byte > 1) return 0; /* more than 64 bits */
        v |= (uint64_t)(byte & 0x7F) << (7 * group);
        if (!(byte & 0x80)) {
            *value = v;
            return 1;
        }
    }
    return 0;
}

static int valid_utf8(const unsigned char *p, const unsigned char *end) {
    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }
        int n = utf8_sequence(p, end);
        if (!n) return 0;
        p += n;
    }
    return 1;
}

/* Read one field's value of row `row` (its union branch already read): 0 when the bytes are not one. */
static int read_value(Reading *r, Column *col, Cursor *c, Py_ssize_t row) {
    uint64_t raw;
    Text *values = &r->outs[col - r->columns].values;
    switch (col->kind) {
    case 'b':
        if (c->p >= c->end || *c->p > 1) return 0;
        if (*c->p++) ((uint8_t *)values->data)[row / 8] |= (uint8_t)(1u << (row % 8));
        return 1;
    case 'i': {
        if (!read_varint(c, &raw)) return 0;
        int64_t value = unzigzag(raw);
        if (value < INT32_MIN || value > INT32_MAX) return 0;
        int32_t narrow = (int32_t)value;
        memcpy(values->data + 4 * row, &narrow, 4);
        return 1;
    }
    case 'l': {
        if (!read_varint(c, &raw)) return 0;
        int64_t value = unzigzag(raw);
        memcpy(values->data + 8 * row, &value, 8);
        return 1;
    }
    case 'f':
    case 'd': {
        int width = width_of(col->kind);
        if (c->end - c->p < width) return 0;
        memcpy(values->data + (size_t)width * row, c->p, (size_t)width);
        c->p += width;
        return 1;
    }
    default: { /* 's', 'y' */
        if (!read_varint(c, &raw)) return 0;
        int64_t length = unzigzag(raw);
        if (length < 0 || length > c->end - c->p) return 0;
        if (col->kind == 's' && !valid_utf8(c->p, c->p + length)) return 0;
        put(values, (const char *)c->p, (size_t)length);
        r->failed = values->out_of_memory;
        if (values->too_large || r->failed) return 0; /* past int32 offsets: fastavro's path reads it */
        c->p += length;
        return 1;
    }
    }
}

static int read_record(Reading *r, Cursor *c, Py_ssize_t row) {
    for (int i = 0; i < r->count; i++) {
        Column *col = &r->columns[i];
        int present = 1;
        if (col->null_branch != NOT_NULLABLE) {
            if (c->p >= c->end) return 0;
            unsigned char branch = *c->p++;
            present = branch == BRANCH_BYTE[1 - col->null_branch];
            if (!present && branch != BRANCH_BYTE[col->null_branch]) return 0;
        }
        ArrayOut *out = &r->outs[i];
        if (present ? !read_value(r, col, c, row) : !array_out_set_null(out, r->rows, row)) {
            r->failed |= !present; /* a null not set: out of memory */
            return 0;
        }
        array_out_end_row(out, row);
    }
    return c->p == c->end; /* nothing left over */
}

static int reading_start(Reading *r, const char *kinds, const char *branches, int count, Py_ssize_t rows) {
    memset(r, 0, sizeof(*r));
    r->rows = rows;
    r->count = count;
    for (int i = 0; i < count; i++) {
        Column *col = &r->columns[i];
        col->kind = kinds[i];
        col->null_branch = branches[i] == '-' ? NOT_NULLABLE : branches[i] - '0';
        if (array_out_start(&r->outs[i], rows, width_of(col->kind)) < 0) return -1;
    }
    return 0;
}

/* Kinds one of "bilfdsy" each, branches one of "-01" each (not nullable, or where null is in the union). */
static int valid_fields(const char *kinds, Py_ssize_t kinds_len, const char *branches, Py_ssize_t branches_len) {
    if (kinds_len != branches_len || kinds_len < 1 || kinds_len > MAX_FIELDS) return 0;
    for (Py_ssize_t i = 0; i < kinds_len; i++)
        if (!kinds[i] || !strchr("bilfdsy", kinds[i]) || !branches[i] || !strchr("-01", branches[i])) return 0;
    return 1;
}

/* decode(data, offsets, first, rows, prefix, kinds, branches) -> [(validity, values, offsets, nulls)] per
 * field, or None when a payload is not exactly `prefix` then one record of the fields. `data` and `offsets`
 * are the buffers of an Arrow binary array without nulls, `first` its offset. */
static PyObject *decode(PyObject *module, PyObject *args) {
    Py_buffer data, offsets;
    Py_ssize_t first, rows, prefix_len, kinds_len, branches_len;
    const char *prefix, *kinds, *branches;
    (void)module;
    if (!PyArg_ParseTuple(args, "y*y*nny#s#s#", &data, &offsets, &first, &rows, &prefix, &prefix_len, &kinds,
                          &kinds_len, &branches, &branches_len))
        return NULL;
    PyObject *result = NULL;
    Reading *reading = NULL;
    if (!valid_fields(kinds, kinds_len, branches, branches_len)) {
        PyErr_SetString(PyExc_ValueError, "decode: kinds and branches must be one of 'bilfdsy' and '-01' each");
        goto done;
    }
    if (!payloads_bounded(&data, &offsets, first, rows)) goto done;
    reading = malloc(sizeof(Reading));
    if (!reading || reading_start(reading, kinds, branches, (int)kinds_len, rows) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t row = 0; row < rows; row++) {
        Cursor c = payload(&data, &offsets, first, row);
        int prefixed = c.end - c.p >= prefix_len && memcmp(c.p, prefix, (size_t)prefix_len) == 0;
        c.p += prefixed ? prefix_len : 0;
        if (!prefixed || !read_record(reading, &c, row)) {
            if (reading->failed) PyErr_NoMemory();
            else result = Py_NewRef(Py_None);
            goto done;
        }
    }
    result = arrays_out_buffers(reading->outs, reading->count, reading->rows);
done:
    if (reading) {
        arrays_out_free(reading->outs, reading->count);
        free(reading);
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    return result;
}

/* ------------------------------------------------------------------------------------------ writing */

/* One column to write: its kind, union, and its Arrow array. */
typedef struct {
    char kind;
    int null_branch;
    ArrayIn in;
} Source;

/* A column is (validity or None, values, offsets or None, first row); `validity` only where nullable. */
static int source_open(Source *s, char kind, char branch, PyObject *column, Py_ssize_t rows) {
    PyObject *validity, *offsets;
    memset(s, 0, sizeof(*s));
    s->kind = kind;
    s->null_branch = branch == '-' ? NOT_NULLABLE : branch - '0';
    if (!PyArg_ParseTuple(column, "Oy*On", &validity, &s->in.values, &offsets, &s->in.first)) return -1;
    if (validity != Py_None && s->null_branch == NOT_NULLABLE) {
        PyErr_SetString(PyExc_ValueError, "encode: nulls in a column that is not nullable");
        return -1;
    }
    return array_in_open(&s->in, validity, offsets, rows, width_of(kind));
}

static void put_varint(Text *t, uint64_t value) {
    char *at = room(t, VARINT_BYTES);
    if (!at) return;
    size_t n = 0;
    while (value >= 0x80) {
        at[n++] = (char)(value | 0x80);
        value >>= 7;
    }
    at[n++] = (char)value;
    t->size += n;
}

static void put_value(Text *t, const ArrayIn *a, char kind, Py_ssize_t row) {
    row += a->first;
    const char *values = (const char *)a->values.buf;
    switch (kind) {
    case 'b': {
        char byte = (((const uint8_t *)values)[row / 8] >> (row % 8)) & 1;
        put(t, &byte, 1);
        return;
    }
    case 'i': {
        int32_t value;
        memcpy(&value, values + 4 * row, 4);
        put_varint(t, zigzag(value));
        return;
    }
    case 'l': {
        int64_t value;
        memcpy(&value, values + 8 * row, 8);
        put_varint(t, zigzag(value));
        return;
    }
    case 'f':
    case 'd':
        put(t, values + (Py_ssize_t)width_of(kind) * row, (size_t)width_of(kind));
        return;
    default: { /* 's', 'y' */
        const int32_t *bounds = (const int32_t *)a->offsets.buf + row;
        put_varint(t, zigzag(bounds[1] - bounds[0]));
        put(t, values + bounds[0], (size_t)(bounds[1] - bounds[0]));
    }
    }
}

/* encode(rows, prefix, kinds, branches, columns) -> (data, offsets) of a binary array, `prefix` then one
 * Avro record per row, or None when the bytes would pass int32 offsets. `columns` holds one
 * (validity or None, values, offsets or None, first row) per field, in the record's order; a null is
 * written as the union's null branch (the caller sends no validity for a field that is not nullable). */
static PyObject *encode(PyObject *module, PyObject *args) {
    Py_ssize_t rows, prefix_len, kinds_len, branches_len;
    const char *prefix, *kinds, *branches;
    PyObject *columns;
    (void)module;
    if (!PyArg_ParseTuple(args, "ny#s#s#O!", &rows, &prefix, &prefix_len, &kinds, &kinds_len, &branches,
                          &branches_len, &PyList_Type, &columns))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(columns);
    if (!valid_fields(kinds, kinds_len, branches, branches_len) || count != kinds_len || rows < 0) {
        PyErr_SetString(PyExc_ValueError, "encode: the columns, kinds and branches do not agree");
        return NULL;
    }
    Source *sources = calloc((size_t)count, sizeof(Source));
    RowsOut out;
    PyObject *result = NULL;
    if (rows_out_start(&out, rows) < 0 || !sources) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++)
        if (source_open(&sources[i], kinds[i], branches[i], PyList_GET_ITEM(columns, i), rows) < 0) goto done;
    for (Py_ssize_t row = 0; row < rows && rows_out_open(&out); row++) {
        put(&out.data, prefix, (size_t)prefix_len);
        for (Py_ssize_t i = 0; i < count; i++) {
            const Source *s = &sources[i];
            if (s->null_branch != NOT_NULLABLE) {
                int is_null = array_in_is_null(&s->in, row);
                put(&out.data, (const char *)&BRANCH_BYTE[is_null ? s->null_branch : 1 - s->null_branch], 1);
                if (is_null) continue;
            }
            put_value(&out.data, &s->in, s->kind, row);
        }
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
    {"decode", decode, METH_VARARGS, "read Avro records of primitive fields into Arrow buffers, or None"},
    {"encode", encode, METH_VARARGS, "write Arrow columns as Avro records, one per row"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "schemas._native_avro", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__native_avro(void) { return PyModule_Create(&module_def); }
