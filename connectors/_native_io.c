/* Records moved between librdkafka and Arrow buffers in C, with no Python object per record, on the
 * librdkafka handle of a confluent-kafka Consumer or Producer: confluent-kafka stays the Kafka client (group
 * membership, rebalance callbacks, transactions, configuration); only the two per-record loops are here.
 * connectors/native_io.py is its Python face and says when it is used; without it (no C compiler at install)
 * sources and sinks use confluent-kafka's per-record calls.
 *
 * What this rests on:
 * - librdkafka is the copy confluent-kafka already loaded: found among the process's shared objects
 *   (dl_iterate_phdr), its functions looked up with dlsym. Only its stable public ABI is used, declared
 *   below, so no librdkafka header is needed to build this.
 * - The rd_kafka_t of a confluent-kafka client is the first field after PyObject_HEAD of its C object
 *   (confluent_kafka.h: `typedef struct { PyObject_HEAD rd_kafka_t *rk; ...} Handle;`); the type name is
 *   checked first.
 * - Reading: each attached partition's queue is forwarded to this reader's queue, so its records never reach
 *   the consumer queue that confluent-kafka's poll serves (which keeps serving rebalances and errors). Records
 *   fetched before a seek or a reassignment are dropped by librdkafka itself (its per-partition op versions)
 *   when this reader takes them.
 * - Producing: records carry no per-message state of confluent-kafka's, so its delivery callback skips them;
 *   a failed delivery inside a transaction makes librdkafka refuse the commit (the transaction needs an
 *   abort). So only a transactional producer may produce this way. When the queue is full this returns, and
 *   the caller serves delivery reports with confluent-kafka's poll: this code never polls a handle, whose
 *   callbacks only confluent-kafka can run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <link.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;
typedef int rd_kafka_resp_err_t;
typedef int rd_kafka_timestamp_type_t;
typedef struct rd_kafka_message_s {
    rd_kafka_resp_err_t err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

#define RD_KAFKA_MSG_F_COPY 0x2
#define RD_KAFKA_PARTITION_UA ((int32_t)-1)
#define RD_KAFKA_RESP_ERR__QUEUE_FULL (-184)

static struct {
    rd_kafka_queue_t *(*queue_new)(rd_kafka_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    rd_kafka_queue_t *(*queue_get_partition)(rd_kafka_t *, const char *, int32_t);
    rd_kafka_queue_t *(*queue_get_consumer)(rd_kafka_t *);
    void (*queue_forward)(rd_kafka_queue_t *, rd_kafka_queue_t *);
    ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rd_kafka_message_t **, size_t);
    void (*message_destroy)(rd_kafka_message_t *);
    int64_t (*message_timestamp)(const rd_kafka_message_t *, rd_kafka_timestamp_type_t *);
    rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
    void (*topic_destroy)(rd_kafka_topic_t *);
    int (*produce)(rd_kafka_topic_t *, int32_t, int, void *, size_t, const void *, size_t, void *);
    rd_kafka_resp_err_t (*last_error)(void);
    const char *(*err2str)(rd_kafka_resp_err_t);
} rk;

typedef struct {
    PyObject_HEAD rd_kafka_t *rk;
} ClientHandle;

static int find_librdkafka(struct dl_phdr_info *info, size_t size, void *found) {
    (void)size;
    if (info->dlpi_name && strstr(info->dlpi_name, "librdkafka")) {
        strncpy((char *)found, info->dlpi_name, 4095);
        return 1;
    }
    return 0;
}

static int load_librdkafka(void) {
    char path[4096] = {0};
    if (!dl_iterate_phdr(find_librdkafka, path)) {
        PyErr_SetString(PyExc_ImportError, "librdkafka is not loaded: import confluent_kafka first");
        return -1;
    }
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) {
        PyErr_Format(PyExc_ImportError, "dlopen(%s): %s", path, dlerror());
        return -1;
    }
#define LOOKUP(field, name)                                                            \
    if (!(*(void **)(&rk.field) = dlsym(lib, name))) {                                 \
        PyErr_Format(PyExc_ImportError, "%s has no %s", path, name);                   \
        return -1;                                                                     \
    }
    LOOKUP(queue_new, "rd_kafka_queue_new");
    LOOKUP(queue_destroy, "rd_kafka_queue_destroy");
    LOOKUP(queue_get_partition, "rd_kafka_queue_get_partition");
    LOOKUP(queue_get_consumer, "rd_kafka_queue_get_consumer");
    LOOKUP(queue_forward, "rd_kafka_queue_forward");
    LOOKUP(consume_batch_queue, "rd_kafka_consume_batch_queue");
    LOOKUP(message_destroy, "rd_kafka_message_destroy");
    LOOKUP(message_timestamp, "rd_kafka_message_timestamp");
    LOOKUP(topic_new, "rd_kafka_topic_new");
    LOOKUP(topic_destroy, "rd_kafka_topic_destroy");
    LOOKUP(produce, "rd_kafka_produce");
    LOOKUP(last_error, "rd_kafka_last_error");
    LOOKUP(err2str, "rd_kafka_err2str");
#undef LOOKUP
    return 0;
}

static rd_kafka_t *handle_of(PyObject *client) {
    const char *name = Py_TYPE(client)->tp_name;
    if (strcmp(name, "cimpl.Consumer") && strcmp(name, "cimpl.Producer")) {
        PyErr_Format(PyExc_TypeError, "expected a confluent_kafka Consumer or Producer, got %s", name);
        return NULL;
    }
    rd_kafka_t *handle = ((ClientHandle *)client)->rk;
    if (!handle) PyErr_SetString(PyExc_RuntimeError, "the client is closed");
    return handle;
}

/* A buffer that grows by doubling, and an Arrow validity bitmap kept beside a column. */
typedef struct {
    char *data;
    size_t size, capacity;
    int failed;
} Growing;

static void grow(Growing *g, const void *bytes, size_t n) {
    if (g->failed) return;
    if (g->size + n > g->capacity) {
        size_t capacity = g->capacity ? g->capacity : 1 << 16;
        while (capacity < g->size + n) capacity *= 2;
        char *data = realloc(g->data, capacity);
        if (!data) {
            g->failed = 1;
            return;
        }
        g->data = data;
        g->capacity = capacity;
    }
    memcpy(g->data + g->size, bytes, n);
    g->size += n;
}

/* A binary column being built: data, int32 offsets, and a validity bitmap (made only once a null comes). */
typedef struct {
    Growing data, offsets;
    uint8_t *validity;
    ssize_t rows, capacity, nulls;
} Column;

static void column_start(Column *c, ssize_t capacity) {
    memset(c, 0, sizeof(*c));
    c->capacity = capacity;
    int32_t zero = 0;
    grow(&c->offsets, &zero, 4);
}

static void column_add(Column *c, const void *bytes, size_t n) {
    if (!bytes) {
        if (!c->validity) {
            c->validity = malloc((size_t)(c->capacity + 7) / 8);
            if (!c->validity) {
                c->data.failed = 1;
                return;
            }
            memset(c->validity, 0xff, (size_t)(c->capacity + 7) / 8);
        }
        c->validity[c->rows / 8] &= (uint8_t) ~(1u << (c->rows % 8));
        c->nulls++;
    } else {
        grow(&c->data, bytes, n);
    }
    int32_t end = (int32_t)c->data.size;
    grow(&c->offsets, &end, 4);
    c->rows++;
}

static int column_failed(Column *c) { return c->data.failed || c->offsets.failed; }

/* (data, offsets, validity or None) as bytes objects, or NULL with an exception set. */
static PyObject *column_buffers(Column *c) {
    PyObject *validity = c->validity ? PyBytes_FromStringAndSize((char *)c->validity, (c->rows + 7) / 8)
                                     : Py_NewRef(Py_None);
    if (!validity) return NULL;
    return Py_BuildValue("(y#y#N)", c->data.data ? c->data.data : "", (Py_ssize_t)c->data.size,
                         c->offsets.data, (Py_ssize_t)c->offsets.size, validity);
}

static void column_free(Column *c) {
    free(c->data.data);
    free(c->offsets.data);
    free(c->validity);
}

/* ------------------------------------------------------------------------------------------ reading */

typedef struct {
    PyObject_HEAD rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    PyObject *client; /* keeps the Consumer (and its rd_kafka_t) alive */
} ColumnReader;

static int ColumnReader_init(ColumnReader *self, PyObject *args, PyObject *kwargs) {
    PyObject *client;
    (void)kwargs;
    if (!PyArg_ParseTuple(args, "O", &client)) return -1;
    if (!(self->rk = handle_of(client))) return -1;
    self->queue = rk.queue_new(self->rk);
    Py_INCREF(client);
    self->client = client;
    return 0;
}

static void ColumnReader_dealloc(ColumnReader *self) {
    if (self->queue) rk.queue_destroy(self->queue);
    Py_XDECREF(self->client);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether the reader and its Consumer are still open (a closed Consumer's handle is NULL). */
static int is_open(ColumnReader *self) {
    if (!self->queue || !((ClientHandle *)self->client)->rk) {
        PyErr_SetString(PyExc_RuntimeError, "the reader or its consumer is closed");
        return 0;
    }
    return 1;
}

/* Forward each of ``partitions`` of ``topic`` to ``destination``. */
static PyObject *forward_partitions(ColumnReader *self, PyObject *args, rd_kafka_queue_t *destination) {
    const char *topic;
    PyObject *partitions;
    if (!PyArg_ParseTuple(args, "sO", &topic, &partitions)) return NULL;
    PyObject *iterator = PyObject_GetIter(partitions), *item;
    if (!iterator) return NULL;
    while ((item = PyIter_Next(iterator))) {
        long partition = PyLong_AsLong(item);
        Py_DECREF(item);
        if (partition == -1 && PyErr_Occurred()) break;
        rd_kafka_queue_t *partition_queue = rk.queue_get_partition(self->rk, topic, (int32_t)partition);
        if (!partition_queue) {
            PyErr_Format(PyExc_RuntimeError, "librdkafka has no queue for %s[%ld]", topic, partition);
            break;
        }
        rk.queue_forward(partition_queue, destination);
        rk.queue_destroy(partition_queue);
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* attach(topic, partitions): these partitions' records and events come to this reader's queue. */
static PyObject *ColumnReader_attach(ColumnReader *self, PyObject *args) {
    if (!is_open(self)) return NULL;
    return forward_partitions(self, args, self->queue);
}

/* detach(topic, partitions): back to the consumer queue, which confluent-kafka serves (its close waits for
 * the events of its partitions there). */
static PyObject *ColumnReader_detach(ColumnReader *self, PyObject *args) {
    if (!is_open(self)) return NULL;
    rd_kafka_queue_t *consumer_queue = rk.queue_get_consumer(self->rk);
    PyObject *result = forward_partitions(self, args, consumer_queue);
    rk.queue_destroy(consumer_queue);
    return result;
}

typedef struct {
    ssize_t at;
    int32_t partition;
    int64_t offset;
    int code;
    char text[512];
} Event;

/* read(max_records, timeout_ms) -> (count, values, keys, partitions, offsets, timestamps, events):
 * up to max_records messages, waiting up to timeout_ms for the first. ``values`` and ``keys`` are
 * (data, int32 offsets, validity bitmap or None) of Arrow binary columns; partitions int32, offsets and
 * timestamps (epoch ms, -1 for none) int64 buffers; ``events`` a list of (at, partition, offset, error
 * code, text) for the messages that are errors (end of partition, ...), which are not records: ``at`` is
 * how many records came before it. The GIL is
 * released while librdkafka is asked and the records are copied. */
static PyObject *ColumnReader_read(ColumnReader *self, PyObject *args) {
    Py_ssize_t max_records;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "ni", &max_records, &timeout_ms)) return NULL;
    if (!is_open(self)) return NULL;
    if (max_records < 1) {
        PyErr_SetString(PyExc_ValueError, "max_records must be at least 1");
        return NULL;
    }
    rd_kafka_message_t **messages = malloc(sizeof(*messages) * (size_t)max_records);
    Event *events = NULL;
    if (!messages) return PyErr_NoMemory();
    Column values, keys;
    column_start(&values, max_records);
    column_start(&keys, max_records);
    Growing partitions = {0}, offsets = {0}, timestamps = {0};
    ssize_t count = 0, records = 0, event_count = 0;
    Py_BEGIN_ALLOW_THREADS;
    /* librdkafka's batch call waits until the batch is full or the timeout passes: wait for the first
     * message only, then take what is already there. */
    count = rk.consume_batch_queue(self->queue, timeout_ms, messages, 1);
    if (count == 1 && max_records > 1) {
        ssize_t more = rk.consume_batch_queue(self->queue, 0, messages + 1, (size_t)max_records - 1);
        if (more > 0) count += more;
    }
    for (ssize_t i = 0; i < count; i++) {
        rd_kafka_message_t *m = messages[i];
        if (m->err) {
            Event *grown = realloc(events, sizeof(Event) * (size_t)(event_count + 1));
            if (grown) {
                events = grown;
                Event *e = &events[event_count++];
                e->at = records;
                e->partition = m->partition;
                e->offset = m->offset;
                e->code = m->err;
                /* an error message's payload is its text (not terminated) */
                size_t n = m->payload ? (m->len < sizeof(e->text) - 1 ? m->len : sizeof(e->text) - 1) : 0;
                if (n) memcpy(e->text, m->payload, n);
                else {
                    strncpy(e->text, rk.err2str(m->err), sizeof(e->text) - 1);
                    n = strlen(e->text);
                }
                e->text[n] = 0;
            } else {
                partitions.failed = 1;
            }
        } else {
            int64_t offset = m->offset, stamp = rk.message_timestamp(m, NULL);
            column_add(&values, m->payload, m->len);
            column_add(&keys, m->key, m->key_len);
            grow(&partitions, &m->partition, 4);
            grow(&offsets, &offset, 8);
            grow(&timestamps, &stamp, 8);
            records++;
        }
        rk.message_destroy(m);
    }
    Py_END_ALLOW_THREADS;
    free(messages);
    PyObject *result = NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_RuntimeError, "rd_kafka_consume_batch_queue failed");
    } else if (column_failed(&values) || column_failed(&keys) || partitions.failed || offsets.failed ||
               timestamps.failed) {
        PyErr_NoMemory();
    } else {
        PyObject *event_list = PyList_New(event_count);
        for (ssize_t i = 0; event_list && i < event_count; i++) {
            PyObject *event = Py_BuildValue("(niLis)", events[i].at, events[i].partition, (long long)events[i].offset,
                                            events[i].code, events[i].text);
            if (!event) Py_CLEAR(event_list);
            else PyList_SET_ITEM(event_list, i, event);
        }
        PyObject *value_buffers = event_list ? column_buffers(&values) : NULL;
        PyObject *key_buffers = value_buffers ? column_buffers(&keys) : NULL;
        if (key_buffers)
            result = Py_BuildValue("(nNNy#y#y#N)", (Py_ssize_t)records, value_buffers, key_buffers,
                                   partitions.data ? partitions.data : "", (Py_ssize_t)partitions.size,
                                   offsets.data ? offsets.data : "", (Py_ssize_t)offsets.size,
                                   timestamps.data ? timestamps.data : "", (Py_ssize_t)timestamps.size,
                                   event_list);
        else {
            Py_XDECREF(event_list);
            Py_XDECREF(value_buffers);
        }
    }
    free(events);
    column_free(&values);
    column_free(&keys);
    free(partitions.data);
    free(offsets.data);
    free(timestamps.data);
    return result;
}

/* close(): free the reader's queue; first detach every partition and read what is left (the consumer's close
 * waits for the records of its partitions that are still in a queue). */
static PyObject *ColumnReader_close(ColumnReader *self, PyObject *unused) {
    (void)unused;
    if (self->queue) rk.queue_destroy(self->queue);
    self->queue = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef ColumnReader_methods[] = {
    {"close", (PyCFunction)ColumnReader_close, METH_NOARGS, "free the reader's queue"},
    {"attach", (PyCFunction)ColumnReader_attach, METH_VARARGS, "forward partitions' records to this reader"},
    {"detach", (PyCFunction)ColumnReader_detach, METH_VARARGS, "forward them to the consumer queue again"},
    {"read", (PyCFunction)ColumnReader_read, METH_VARARGS, "a batch of records as Arrow buffers"},
    {NULL}};

static PyTypeObject ColumnReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "connectors._native_io.ColumnReader",
    .tp_basicsize = sizeof(ColumnReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ColumnReader_init,
    .tp_dealloc = (destructor)ColumnReader_dealloc,
    .tp_methods = ColumnReader_methods,
};

/* ---------------------------------------------------------------------------------------- producing */

/* A binary column given as buffer-protocol objects (pyarrow Buffers as they are) and the index of its first
 * row in them (an Arrow array's offset). */
typedef struct {
    Py_buffer data, offsets, validity;
    int has_validity;
    Py_ssize_t first;
} Given;

static int row_is_null(const Given *g, Py_ssize_t row) {
    row += g->first;
    return g->has_validity && !(((const uint8_t *)g->validity.buf)[row / 8] & (1u << (row % 8)));
}

/* Where row ``row``'s bytes start and end. */
static const char *row_bytes(const Given *g, Py_ssize_t row, size_t *length) {
    const int32_t *bounds = (const int32_t *)g->offsets.buf + g->first + row;
    *length = (size_t)(bounds[1] - bounds[0]);
    return (const char *)g->data.buf + bounds[0];
}

static int given_open(PyObject *buffers, Given *g, Py_ssize_t rows, const char *what) {
    PyObject *data, *offsets, *validity;
    memset(g, 0, sizeof(*g));
    if (!PyTuple_Check(buffers) || !PyArg_ParseTuple(buffers, "OOOn", &data, &offsets, &validity, &g->first)) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_TypeError, "%s: expected (data, offsets, validity, first)", what);
        return -1;
    }
    if (PyObject_GetBuffer(data, &g->data, PyBUF_SIMPLE) < 0) return -1;
    if (PyObject_GetBuffer(offsets, &g->offsets, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&g->data);
        return -1;
    }
    if (validity != Py_None) {
        if (PyObject_GetBuffer(validity, &g->validity, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&g->data);
            PyBuffer_Release(&g->offsets);
            return -1;
        }
        g->has_validity = 1;
    }
    const int32_t *bounds = (const int32_t *)g->offsets.buf + g->first;
    Py_ssize_t last = g->first + rows;
    if (g->first < 0 || g->offsets.len < 4 * (last + 1) || (g->has_validity && g->validity.len < (last + 7) / 8) ||
        (rows && (bounds[0] < 0 || bounds[rows] > g->data.len))) {
        PyErr_Format(PyExc_ValueError, "the %s buffers do not hold %zd values", what, rows);
        PyBuffer_Release(&g->data);
        PyBuffer_Release(&g->offsets);
        if (g->has_validity) PyBuffer_Release(&g->validity);
        return -1;
    }
    return 0;
}

static void given_close(Given *g) {
    PyBuffer_Release(&g->data);
    PyBuffer_Release(&g->offsets);
    if (g->has_validity) PyBuffer_Release(&g->validity);
}

/* produce_column(producer, topic, rows, values, keys, start) -> (next, error): produce rows start.. of a
 * binary value column, each with the key of the same row when ``keys`` is given, to the partition
 * librdkafka's partitioner picks. ``values`` and ``keys`` are (data, int32 offsets, validity bitmap or None,
 * first row) of Arrow binary arrays; a null value is a tombstone, a null key no key. ``next`` is the first
 * row not produced: ``rows``, or less when the producer's queue is full (serve delivery reports with the
 * Producer's poll, then call again from there) or librdkafka refused a record (``error``, its error code,
 * else 0). The GIL is released while producing. */
static PyObject *produce_column(PyObject *module, PyObject *args) {
    PyObject *client, *value_buffers, *key_buffers;
    const char *topic;
    Py_ssize_t rows, start;
    (void)module;
    if (!PyArg_ParseTuple(args, "OsnOOn", &client, &topic, &rows, &value_buffers, &key_buffers, &start))
        return NULL;
    rd_kafka_t *handle = handle_of(client);
    if (!handle) return NULL;
    Given values, keys;
    if (given_open(value_buffers, &values, rows, "values") < 0) return NULL;
    int has_keys = key_buffers != Py_None;
    if (has_keys && given_open(key_buffers, &keys, rows, "keys") < 0) {
        given_close(&values);
        return NULL;
    }
    Py_ssize_t next = start < 0 ? 0 : start;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS;
    rd_kafka_topic_t *rkt = rk.topic_new(handle, topic, NULL);
    for (; rkt && next < rows; next++) {
        size_t value_len = 0, key_len = 0;
        const char *value = row_is_null(&values, next) ? NULL : row_bytes(&values, next, &value_len);
        const char *key = has_keys && !row_is_null(&keys, next) ? row_bytes(&keys, next, &key_len) : NULL;
        if (rk.produce(rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, (void *)value, value_len, key, key_len,
                       NULL) == -1) {
            error = rk.last_error();
            break;
        }
    }
    if (rkt) rk.topic_destroy(rkt);
    else error = rk.last_error();
    Py_END_ALLOW_THREADS;
    given_close(&values);
    if (has_keys) given_close(&keys);
    return Py_BuildValue("(ni)", next, error == RD_KAFKA_RESP_ERR__QUEUE_FULL ? 0 : error);
}

static PyMethodDef module_methods[] = {
    {"produce_column", produce_column, METH_VARARGS, "produce the rows of Arrow binary columns"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "connectors._native_io", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit__native_io(void) {
    if (load_librdkafka() < 0) return NULL;
    if (PyType_Ready(&ColumnReaderType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (!module) return NULL;
    Py_INCREF(&ColumnReaderType);
    if (PyModule_AddObject(module, "ColumnReader", (PyObject *)&ColumnReaderType) < 0) {
        Py_DECREF(&ColumnReaderType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
