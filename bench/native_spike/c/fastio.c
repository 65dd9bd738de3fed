/* A spike, not part of epochline: the two per-record loops of a source and a sink in C, on the librdkafka
 * handle of a confluent-kafka Consumer or Producer, so that confluent-kafka stays the Kafka client (group
 * membership, rebalance callbacks, transactions) and no Python object is made per record.
 *
 * - librdkafka is the copy confluent-kafka already loaded: found among the process's shared objects
 *   (dl_iterate_phdr), its functions looked up with dlsym. Only its stable public ABI is used, declared
 *   below, so no header is needed to build this.
 * - The rd_kafka_t of a confluent-kafka client is the first field after PyObject_HEAD of its C object
 *   (confluent_kafka.h: `typedef struct { PyObject_HEAD rd_kafka_t *rk; ...} Handle;`).
 * - Reading: each partition's queue is forwarded to a queue of this module's, so records never reach the
 *   consumer queue that confluent-kafka's poll serves (which keeps serving rebalances and errors).
 * - Producing: records carry no per-message state, so confluent-kafka's delivery callback ignores them; a
 *   failed delivery inside a transaction makes the commit fail (the transaction needs an abort). When the
 *   queue is full this returns, and the caller serves delivery reports with confluent-kafka's poll: this
 *   code never polls the handle, whose callbacks only confluent-kafka can run.
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

/* ------------------------------------------------------------------------------------------ reading */

typedef struct {
    PyObject_HEAD rd_kafka_t *rk;
    rd_kafka_queue_t *queue;
    PyObject *client; /* keeps the Consumer (and its rd_kafka_t) alive */
} ColumnReader;

static int ColumnReader_init(ColumnReader *self, PyObject *args, PyObject *kwargs) {
    PyObject *client;
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
            PyErr_Format(PyExc_RuntimeError, "no queue for %s[%ld]", topic, partition);
            break;
        }
        rk.queue_forward(partition_queue, destination);
        rk.queue_destroy(partition_queue);
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

/* attach(topic, partitions): these partitions' records come to this reader's queue. */
static PyObject *ColumnReader_attach(ColumnReader *self, PyObject *args) {
    return forward_partitions(self, args, self->queue);
}

/* detach(topic, partitions): back to the consumer queue, which confluent-kafka serves (its close waits for
 * events on these queues). */
static PyObject *ColumnReader_detach(ColumnReader *self, PyObject *args) {
    rd_kafka_queue_t *consumer_queue = rk.queue_get_consumer(self->rk);
    PyObject *result = forward_partitions(self, args, consumer_queue);
    rk.queue_destroy(consumer_queue);
    return result;
}

typedef struct {
    char *data;
    size_t size, capacity;
} Growing;

static int grow(Growing *g, const void *bytes, size_t n) {
    if (g->size + n > g->capacity) {
        size_t capacity = g->capacity ? g->capacity : 1 << 16;
        while (capacity < g->size + n) capacity *= 2;
        char *data = realloc(g->data, capacity);
        if (!data) return -1;
        g->data = data;
        g->capacity = capacity;
    }
    memcpy(g->data + g->size, bytes, n);
    g->size += n;
    return 0;
}

/* read(max_records, timeout_ms) -> (values, value_offsets, partitions, offsets, timestamps, count, error):
 * up to max_records records as Arrow buffers (int32 value offsets; int32 partitions; int64 offsets and
 * epoch-ms timestamps, -1 for none), waiting up to timeout_ms for the first. The GIL is released while
 * librdkafka is asked and the records are copied. ``error`` is None, or (code, text) of the first error
 * event, which ends the batch before it. */
static PyObject *ColumnReader_read(ColumnReader *self, PyObject *args) {
    Py_ssize_t max_records;
    int timeout_ms;
    if (!PyArg_ParseTuple(args, "ni", &max_records, &timeout_ms)) return NULL;
    rd_kafka_message_t **messages = malloc(sizeof(*messages) * (size_t)max_records);
    Growing values = {0}, value_offsets = {0}, partitions = {0}, offsets = {0}, timestamps = {0};
    ssize_t count = 0, taken = 0;
    int failed = 0, error_code = 0;
    const char *error_text = NULL;
    Py_BEGIN_ALLOW_THREADS;
    /* librdkafka's batch call waits until the batch is full or the timeout passes: wait for the first
     * record only, then take what is already there (as the source does with poll and consume). */
    count = rk.consume_batch_queue(self->queue, timeout_ms, messages, 1);
    if (count == 1 && max_records > 1) {
        ssize_t more = rk.consume_batch_queue(self->queue, 0, messages + 1, (size_t)max_records - 1);
        if (more > 0) count += more;
    }
    int32_t zero = 0;
    failed |= grow(&value_offsets, &zero, 4);
    for (ssize_t i = 0; i < count; i++) {
        rd_kafka_message_t *m = messages[i];
        if (m->err && !error_code) {
            error_code = m->err;
            error_text = rk.err2str(m->err);
        }
        if (!error_code) {
            int64_t offset = m->offset, stamp = rk.message_timestamp(m, NULL);
            failed |= grow(&values, m->payload ? m->payload : "", m->payload ? m->len : 0);
            int32_t end = (int32_t)values.size;
            failed |= grow(&value_offsets, &end, 4);
            failed |= grow(&partitions, &m->partition, 4);
            failed |= grow(&offsets, &offset, 8);
            failed |= grow(&timestamps, &stamp, 8);
            taken++;
        }
        rk.message_destroy(m);
    }
    Py_END_ALLOW_THREADS;
    free(messages);
    PyObject *result = NULL;
    if (count < 0) {
        PyErr_SetString(PyExc_RuntimeError, "rd_kafka_consume_batch_queue failed");
    } else if (failed) {
        PyErr_NoMemory();
    } else {
        PyObject *error = error_code ? Py_BuildValue("(is)", error_code, error_text) : Py_NewRef(Py_None);
        result = Py_BuildValue("(y#y#y#y#y#nN)", values.data ? values.data : "", (Py_ssize_t)values.size,
                               value_offsets.data, (Py_ssize_t)value_offsets.size,
                               partitions.data ? partitions.data : "", (Py_ssize_t)partitions.size,
                               offsets.data ? offsets.data : "", (Py_ssize_t)offsets.size,
                               timestamps.data ? timestamps.data : "", (Py_ssize_t)timestamps.size,
                               (Py_ssize_t)taken, error);
    }
    free(values.data);
    free(value_offsets.data);
    free(partitions.data);
    free(offsets.data);
    free(timestamps.data);
    return result;
}

static PyMethodDef ColumnReader_methods[] = {
    {"attach", (PyCFunction)ColumnReader_attach, METH_VARARGS, "forward partitions' records to this reader"},
    {"detach", (PyCFunction)ColumnReader_detach, METH_VARARGS, "forward them to the consumer queue again"},
    {"read", (PyCFunction)ColumnReader_read, METH_VARARGS, "a batch of records as Arrow buffers"},
    {NULL}};

static PyTypeObject ColumnReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fastio.ColumnReader",
    .tp_basicsize = sizeof(ColumnReader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ColumnReader_init,
    .tp_dealloc = (destructor)ColumnReader_dealloc,
    .tp_methods = ColumnReader_methods,
};

/* ---------------------------------------------------------------------------------------- producing */

/* produce_column(producer, topic, data, offsets, start) -> next: produce the values start.. of an Arrow
 * binary column given as its data buffer and int32 offsets (any buffer-protocol objects: pyarrow Buffers
 * as they are), to the partition librdkafka's partitioner picks. Returns the index of the first value not
 * produced: the column's length, or less when the producer's queue is full (serve delivery reports with
 * the Producer's poll, then call again from there). The GIL is released while producing. */
static PyObject *produce_column(PyObject *module, PyObject *args) {
    PyObject *client;
    const char *topic;
    Py_buffer data, offsets;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "Osy*y*n", &client, &topic, &data, &offsets, &start)) return NULL;
    rd_kafka_t *handle = handle_of(client);
    Py_ssize_t rows = offsets.len / 4 - 1, next = start;
    int error = 0;
    if (handle) {
        const int32_t *bounds = offsets.buf;
        const char *bytes = data.buf;
        Py_BEGIN_ALLOW_THREADS;
        rd_kafka_topic_t *rkt = rk.topic_new(handle, topic, NULL);
        for (; rkt && next < rows; next++) {
            if (rk.produce(rkt, RD_KAFKA_PARTITION_UA, RD_KAFKA_MSG_F_COPY, (void *)(bytes + bounds[next]),
                           (size_t)(bounds[next + 1] - bounds[next]), NULL, 0, NULL) == -1) {
                error = rk.last_error();
                break;
            }
        }
        if (rkt) rk.topic_destroy(rkt);
        else error = rk.last_error();
        Py_END_ALLOW_THREADS;
    }
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    if (!handle) return NULL;
    if (error && error != RD_KAFKA_RESP_ERR__QUEUE_FULL) {
        PyErr_Format(PyExc_RuntimeError, "producing to %s: %s", topic, rk.err2str(error));
        return NULL;
    }
    return PyLong_FromSsize_t(next);
}

static PyMethodDef module_methods[] = {
    {"produce_column", produce_column, METH_VARARGS, "produce an Arrow binary column's values"},
    {NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "fastio", NULL, -1, module_methods};

PyMODINIT_FUNC PyInit_fastio(void) {
    if (load_librdkafka() < 0) return NULL;
    if (PyType_Ready(&ColumnReaderType) < 0) return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (!module) return NULL;
    Py_INCREF(&ColumnReaderType);
    PyModule_AddObject(module, "ColumnReader", (PyObject *)&ColumnReaderType);
    return module;
}
