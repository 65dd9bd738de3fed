/* What the C codecs (schemas/_native_json.c, schemas/_native_avro.c) share: Arrow arrays filled while
 * payloads are read (ArrayOut) and read while rows are written (ArrayIn), the binary array of written rows
 * (RowsOut), a growable byte buffer whose size Arrow's int32 offsets can address (Text), and the UTF-8 check
 * Arrow's own validation makes. Included by each, so every function here is static. */
#ifndef EPOCHLINE_NATIVE_ARROW_H
#define EPOCHLINE_NATIVE_ARROW_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VARIABLE_WIDTH (-1) /* the width of strings and bytes: int32 offsets into values that grow */

/* Bytes that grow by doubling: a string field's values (reading) or the rows' text (writing). Arrow's
 * int32 offsets address at most INT32_MAX bytes, so it never grows beyond: `too_large` once it would,
 * `out_of_memory` once an allocation failed. */
typedef struct {
    char *data;
    size_t size, capacity;
    int too_large, out_of_memory;
} Text;

/* Where `n` more bytes go (the caller adds them to `size`), or NULL once the text cannot grow. */
static char *room(Text *t, size_t n) {
    if (t->too_large || t->out_of_memory) return NULL;
    if (t->size + n > t->capacity) {
        size_t capacity = t->capacity ? t->capacity : 1 << 16;
        while (capacity < t->size + n) capacity *= 2;
        if (capacity > INT32_MAX) {
            t->too_large = 1;
            return NULL;
        }
        char *data = realloc(t->data, capacity);
        if (!data) {
            t->out_of_memory = 1;
            return NULL;
        }
        t->data = data;
        t->capacity = capacity;
    }
    return t->data + t->size;
}

static void put(Text *t, const char *bytes, size_t n) {
    char *at = room(t, n);
    if (!at) return;
    memcpy(at, bytes, n);
    t->size += n;
}

/* Length of the valid UTF-8 sequence at p (no overlong form, no surrogate, at most U+10FFFF), or 0. */
static int utf8_sequence(const unsigned char *p, const unsigned char *end) {
    unsigned char b = p[0];
    int n;
    unsigned char low = 0x80, high = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) n = 2;
    else if (b >= 0xE0 && b <= 0xEF) {
        n = 3;
        if (b == 0xE0) low = 0xA0;
        if (b == 0xED) high = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        n = 4;
        if (b == 0xF0) low = 0x90;
        if (b == 0xF4) high = 0x8F;
    } else return 0;
    if (end - p < n || p[1] < low || p[1] > high) return 0;
    for (int i = 2; i < n; i++)
        if (p[i] < 0x80 || p[i] > 0xBF) return 0;
    return n;
}

typedef struct {
    const unsigned char *p, *end;
} Cursor;

/* ------------------------------------------------------------------------------------ reading payloads */

/* Whether `offsets` (int32, of an Arrow binary array without nulls, from row `first`) bound `rows` payloads
 * inside `data`, never going backwards; else a ValueError is set. */
static int payloads_bounded(const Py_buffer *data, const Py_buffer *offsets, Py_ssize_t first, Py_ssize_t rows) {
    if (first < 0 || rows < 0 || offsets->len < 4 * (first + rows + 1)) goto bad;
    const int32_t *bounds = (const int32_t *)offsets->buf + first;
    if (rows && (bounds[0] < 0 || bounds[rows] > data->len)) goto bad;
    for (Py_ssize_t row = 0; row < rows; row++)
        if (bounds[row + 1] < bounds[row]) goto bad;
    return 1;
bad:
    PyErr_SetString(PyExc_ValueError, "decode: the payloads' offsets do not bound them inside their data");
    return 0;
}

/* Payload `row` of the buffers `payloads_bounded` accepted. */
static Cursor payload(const Py_buffer *data, const Py_buffer *offsets, Py_ssize_t first, Py_ssize_t row) {
    const int32_t *bounds = (const int32_t *)offsets->buf + first + row;
    const unsigned char *start = (const unsigned char *)data->buf;
    return (Cursor){start + bounds[0], start + bounds[1]};
}

/* One field's output: an Arrow validity bitmap (made at the first null), values (`width` bytes a row, a
 * bitmap for booleans, or the bytes of strings) and, for strings, int32 offsets. */
typedef struct {
    uint8_t *validity;
    Py_ssize_t nulls;
    Text values;
    int32_t *offsets;
} ArrayOut;

/* `width`: bytes per value, 0 for a bitmap (booleans), VARIABLE_WIDTH for strings and bytes. -1: no memory. */
static int array_out_start(ArrayOut *a, Py_ssize_t rows, int width) {
    memset(a, 0, sizeof(*a));
    if (width == VARIABLE_WIDTH) {
        a->offsets = calloc((size_t)rows + 1, 4);
        return a->offsets ? 0 : -1;
    }
    size_t size = width == 0 ? (size_t)(rows + 7) / 8 : (size_t)width * (size_t)rows;
    a->values = (Text){.data = calloc(size ? size : 1, 1), .size = size, .capacity = size};
    return a->values.data ? 0 : -1;
}

/* Row `row` of `rows` is null; 0 when out of memory. */
static int array_out_set_null(ArrayOut *a, Py_ssize_t rows, Py_ssize_t row) {
    if (!a->validity) {
        a->validity = malloc((size_t)(rows + 7) / 8);
        if (!a->validity) return 0;
        memset(a->validity, 0xff, (size_t)(rows + 7) / 8);
    }
    a->validity[row / 8] &= (uint8_t) ~(1u << (row % 8));
    a->nulls++;
    return 1;
}

/* Row `row` is complete: a string's end is where its values end now. */
static void array_out_end_row(ArrayOut *a, Py_ssize_t row) {
    if (a->offsets) a->offsets[row + 1] = (int32_t)a->values.size;
}

static void array_out_free(ArrayOut *a) {
    free(a->validity);
    free(a->values.data);
    free(a->offsets);
}

static void arrays_out_free(ArrayOut *arrays, int count) {
    for (int i = 0; i < count; i++) array_out_free(&arrays[i]);
}

/* [(validity or None, values, offsets or None, nulls)] of `count` arrays of `rows` rows each. */
static PyObject *arrays_out_buffers(const ArrayOut *arrays, int count, Py_ssize_t rows) {
    PyObject *out = PyList_New(count);
    if (!out) return NULL;
    for (int i = 0; i < count; i++) {
        const ArrayOut *a = &arrays[i];
        PyObject *item = Py_BuildValue(
            "(Ny#Nn)",
            a->validity ? PyBytes_FromStringAndSize((char *)a->validity, (rows + 7) / 8) : Py_NewRef(Py_None),
            a->values.data ? a->values.data : "", (Py_ssize_t)a->values.size,
            a->offsets ? PyBytes_FromStringAndSize((char *)a->offsets, 4 * (rows + 1)) : Py_NewRef(Py_None),
            a->nulls);
        if (!item) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

/* ------------------------------------------------------------------------------------------ writing rows */

/* The buffers of one Arrow array being written, from row `first`. */
typedef struct {
    Py_buffer validity, values, offsets;
    int has_validity, has_offsets;
    Py_ssize_t first;
} ArrayIn;

/* Take `validity` and `offsets` (each an object with the buffer protocol, or None) beside `values`, already
 * taken, and check that they hold `rows` rows of `width` (as for array_out_start); -1 with an error set. */
static int array_in_open(ArrayIn *a, PyObject *validity, PyObject *offsets, Py_ssize_t rows, int width) {
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &a->validity, PyBUF_SIMPLE) < 0) return -1;
        a->has_validity = 1;
    }
    if (offsets != Py_None) {
        if (PyObject_GetBuffer(offsets, &a->offsets, PyBUF_SIMPLE) < 0) return -1;
        a->has_offsets = 1;
    }
    Py_ssize_t last = a->first + rows;
    int fits = a->first >= 0 && (!a->has_validity || a->validity.len >= (last + 7) / 8);
    if (width == 0) fits = fits && a->values.len >= (last + 7) / 8;
    else if (width > 0) fits = fits && a->values.len >= width * last;
    else {
        const int32_t *bounds = (const int32_t *)a->offsets.buf;
        fits = fits && a->has_offsets && a->offsets.len >= 4 * (last + 1) &&
               (!rows || (bounds[a->first] >= 0 && bounds[last] <= a->values.len));
    }
    if (!fits) {
        PyErr_SetString(PyExc_ValueError, "encode: a column's buffers do not hold its rows");
        return -1;
    }
    return 0;
}

static int array_in_is_null(const ArrayIn *a, Py_ssize_t row) {
    row += a->first;
    return a->has_validity && !(((const uint8_t *)a->validity.buf)[row / 8] & (1u << (row % 8)));
}

static void array_in_close(ArrayIn *a) {
    if (a->values.obj) PyBuffer_Release(&a->values);
    if (a->has_validity) PyBuffer_Release(&a->validity);
    if (a->has_offsets) PyBuffer_Release(&a->offsets);
}

/* The rows written so far, as the data and int32 offsets of an Arrow binary array. */
typedef struct {
    Text data;
    int32_t *offsets;
} RowsOut;

static int rows_out_start(RowsOut *r, Py_ssize_t rows) {
    memset(r, 0, sizeof(*r));
    r->offsets = malloc(4 * ((size_t)rows + 1));
    if (!r->offsets) return -1;
    r->offsets[0] = 0;
    return 0;
}

/* Whether more rows can be written (the data is neither past int32 offsets nor out of memory). */
static int rows_out_open(const RowsOut *r) { return !r->data.too_large && !r->data.out_of_memory; }

static void rows_out_end_row(RowsOut *r, Py_ssize_t row) { r->offsets[row + 1] = (int32_t)r->data.size; }

/* (data, offsets) of `rows` rows; None when they would pass int32 offsets; NULL (MemoryError) when out of
 * memory. */
static PyObject *rows_out_result(const RowsOut *r, Py_ssize_t rows) {
    if (r->data.out_of_memory) return PyErr_NoMemory();
    if (r->data.too_large) return Py_NewRef(Py_None);
    return Py_BuildValue("(y#y#)", r->data.data ? r->data.data : "", (Py_ssize_t)r->data.size, (char *)r->offsets,
                         (Py_ssize_t)(4 * (rows + 1)));
}

static void rows_out_free(RowsOut *r) {
    free(r->data.data);
    free(r->offsets);
}

#endif
