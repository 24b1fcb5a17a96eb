/* The records of a Kafka v2 record batch, checked and read in one pass.
 *
 * The compiled fast path of luxun/records.py (which has the pure-Python twin of each
 * function and says what the format is). A produced batch is checked record by record
 * before anything of it is stored, as Kafka's broker does (DefaultRecord.readFrom and
 * LogValidator); in Python that costs about 2 us per record, here a few ns.
 *
 *   check(body, count[, start[, keys]]) -> int | tuple[int, tuple[int, ...]] | tuple[int, int, str]
 *       body[start:]: the batch's records, uncompressed (any buffer); count: its recordCount.
 *       Success: the largest timestamp delta of the records (an int); with `keys` true,
 *       (that delta, the indexes of the records whose key is null), read in the same pass
 *       (a compacted topic refuses them).
 *       Failure: (Kafka error code, index of the record at fault, message).
 *   values(body, count[, start]) -> bytes | tuple[int, int, str]
 *       The same checks; success: each record's value as an i32 big-endian length and its
 *       bytes, one after the other (a null value as length 0): the messages of a Luxun
 *       pack as idl.pack.encode_pack_written takes them.
 *
 * Every read is bounds-checked against the record's own length and the body's end;
 * nothing is allocated per record (but for a keyless record's index, when asked). Thread-safety: pure functions; the GIL is released
 * while the records are scanned (the buffer is held by the caller for the call).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INVALID_RECORD 87
/* The smallest record: length, attributes, timestamp delta, offset delta, key length,
 * value length, header count, one byte each. */
#define MIN_RECORD 7

typedef struct {
    int failed;
    Py_ssize_t record; /* index of the record at fault */
    Py_ssize_t at;     /* byte offset in the body */
    char message[160];
} fault;

/* A zigzag varint of at most `maxlen` bytes (5: Kafka's int fields, 10: its long ones). */
static inline int read_varint(const uint8_t **pp, const uint8_t *end, int maxlen, int64_t *out) {
    const uint8_t *p = *pp;
    if (p < end && *p < 0x80) { /* one byte: most fields of most records */
        *out = (int64_t)(*p >> 1) ^ -(int64_t)(*p & 1);
        *pp = p + 1;
        return 0;
    }
    uint64_t v = 0;
    int shift = 0;
    for (int i = 0;; i++) {
        if (i >= maxlen)
            return -2;
        if (p >= end)
            return -1;
        uint8_t b = *p++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
        shift += 7;
    }
    if (maxlen == 5 && v > 0xffffffffULL)
        return -2;
    if (maxlen == 5)
        *out = (int64_t)(int32_t)((uint32_t)(v >> 1) ^ (uint32_t)(-(int64_t)(v & 1)));
    else
        *out = (int64_t)((v >> 1) ^ (uint64_t)(-(int64_t)(v & 1)));
    *pp = p;
    return 0;
}

#define FAIL(...)                                                             \
    do {                                                                      \
        f->failed = 1;                                                        \
        f->record = i;                                                        \
        f->at = (Py_ssize_t)(p - start);                                      \
        snprintf(f->message, sizeof f->message, __VA_ARGS__);                 \
        return -1;                                                            \
    } while (0)

#define VARINT(field, maxlen, limit, what)                                    \
    do {                                                                      \
        int r_ = read_varint(&p, (limit), (maxlen), &(field));                \
        if (r_ == -1)                                                         \
            FAIL("the %s runs past its record", what);                        \
        if (r_ == -2)                                                         \
            FAIL("the %s is a varint longer than %d bytes", what, maxlen);    \
    } while (0)

/* The indexes of the records without a key (grown as found; none: nothing allocated). */
typedef struct {
    Py_ssize_t *at;
    Py_ssize_t n, cap;
    int oom;
} keyless;

static void note_keyless(keyless *k, Py_ssize_t i) {
    if (k->n == k->cap) {
        Py_ssize_t cap = k->cap ? 2 * k->cap : 16;
        Py_ssize_t *grown = realloc(k->at, (size_t)cap * sizeof *grown);
        if (!grown) {
            k->oom = 1;
            return;
        }
        k->at = grown;
        k->cap = cap;
    }
    k->at[k->n++] = i;
}

/* Scan `count` records of `start[0:size]`. With `out`, append each value (i32 length,
 * bytes) at *out and advance it; with `keys`, note the records whose key is null.
 * Returns 0 (and *max_delta) or -1 with *f filled. */
static int scan(const uint8_t *start, Py_ssize_t size, Py_ssize_t count, uint8_t **out, int64_t *max_delta,
                keyless *keys, fault *f) {
    const uint8_t *p = start, *end = start + size;
    int64_t top = INT64_MIN;
    Py_ssize_t i = 0;
    for (i = 0; i < count; i++) {
        int64_t length, ts_delta, offset_delta, klen, vlen, nheaders, hk, hv;
        if (p >= end)
            FAIL("the batch says %zd records, its bytes end after %zd", count, i);
        VARINT(length, 5, end, "record length");
        if (length < MIN_RECORD - 1 || length > end - p)
            FAIL("record length %lld with %lld bytes left", (long long)length, (long long)(end - p));
        const uint8_t *rend = p + length;
        p++; /* attributes: unused */
        VARINT(ts_delta, 10, rend, "timestamp delta");
        VARINT(offset_delta, 5, rend, "offset delta");
        if (offset_delta != i)
            FAIL("offset delta %lld, expected %zd", (long long)offset_delta, i);
        VARINT(klen, 5, rend, "key length");
        if (klen < -1)
            FAIL("key length %lld", (long long)klen);
        if (klen > rend - p)
            FAIL("key length %lld runs past its record", (long long)klen);
        if (klen > 0)
            p += klen;
        else if (klen == -1 && keys)
            note_keyless(keys, i);
        VARINT(vlen, 5, rend, "value length");
        if (vlen < -1)
            FAIL("value length %lld", (long long)vlen);
        if (vlen > rend - p)
            FAIL("value length %lld runs past its record", (long long)vlen);
        if (out) {
            uint32_t n = vlen > 0 ? (uint32_t)vlen : 0;
            uint8_t *o = *out;
            o[0] = (uint8_t)(n >> 24);
            o[1] = (uint8_t)(n >> 16);
            o[2] = (uint8_t)(n >> 8);
            o[3] = (uint8_t)n;
            if (n)
                memcpy(o + 4, p, n);
            *out = o + 4 + n;
        }
        if (vlen > 0)
            p += vlen;
        VARINT(nheaders, 5, rend, "header count");
        if (nheaders < 0 || nheaders > rend - p)
            FAIL("header count %lld", (long long)nheaders);
        for (int64_t h = 0; h < nheaders; h++) {
            VARINT(hk, 5, rend, "header key length");
            if (hk < 0)
                FAIL("header key length %lld", (long long)hk);
            if (hk > rend - p)
                FAIL("header key length %lld runs past its record", (long long)hk);
            p += hk;
            VARINT(hv, 5, rend, "header value length");
            if (hv < -1)
                FAIL("header value length %lld", (long long)hv);
            if (hv > rend - p)
                FAIL("header value length %lld runs past its record", (long long)hv);
            if (hv > 0)
                p += hv;
        }
        if (p != rend)
            FAIL("the record's fields end %lld bytes before its length says", (long long)(rend - p));
        if (ts_delta > top)
            top = ts_delta;
    }
    if (p != end) {
        i = count;
        FAIL("%lld bytes follow the batch's %zd records", (long long)(end - p), count);
    }
    *max_delta = top;
    return 0;
}

static PyObject *fault_tuple(const fault *f) {
    return Py_BuildValue("(inN)", INVALID_RECORD, f->record,
                         PyUnicode_FromFormat("record %zd: %s (byte %zd of the records)", f->record, f->message, f->at));
}

/* (body, count[, start]): the records are body[start:]. */
static int parse(PyObject *args, Py_buffer *view, Py_ssize_t *count) {
    Py_ssize_t start = 0;
    if (!PyArg_ParseTuple(args, "y*n|n", view, count, &start))
        return -1;
    if (*count < 1 || start < 0 || start > view->len) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "record count %zd, start %zd: at least one record, inside the buffer", *count,
                     start);
        return -1;
    }
    view->buf = (char *)view->buf + start; /* PyBuffer_Release needs only view->obj */
    view->len -= start;
    return 0;
}

static PyObject *check(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count, start = 0;
    int want_keys = 0;
    if (!PyArg_ParseTuple(args, "y*n|np", &view, &count, &start, &want_keys))
        return NULL;
    if (count < 1 || start < 0 || start > view.len) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "record count %zd, start %zd: at least one record, inside the buffer", count,
                     start);
        return NULL;
    }
    fault f = {0};
    keyless k = {0};
    int64_t top = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS r = scan((const uint8_t *)view.buf + start, view.len - start, count, NULL, &top,
                                    want_keys ? &k : NULL, &f);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    if (r < 0) {
        free(k.at);
        return fault_tuple(&f);
    }
    if (!want_keys)
        return PyLong_FromLongLong(top);
    if (k.oom) {
        free(k.at);
        return PyErr_NoMemory();
    }
    PyObject *at = PyTuple_New(k.n);
    for (Py_ssize_t j = 0; at && j < k.n; j++) {
        PyObject *index = PyLong_FromSsize_t(k.at[j]);
        if (!index) {
            Py_CLEAR(at);
            break;
        }
        PyTuple_SET_ITEM(at, j, index);
    }
    free(k.at);
    return at ? Py_BuildValue("(LN)", (long long)top, at) : NULL;
}

static PyObject *values(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t count;
    if (parse(args, &view, &count) < 0)
        return NULL;
    fault f = {0};
    int64_t top = 0;
    if (count > view.len / MIN_RECORD) {
        f.failed = 1;
        f.record = view.len / MIN_RECORD;
        snprintf(f.message, sizeof f.message, "the batch says %zd records; %zd bytes hold at most %zd", count,
                 view.len, view.len / MIN_RECORD);
        PyBuffer_Release(&view);
        return fault_tuple(&f);
    }
    /* Each record gives at most 4 + its value's bytes, and its value is inside the body. */
    PyObject *result = PyBytes_FromStringAndSize(NULL, view.len + 4 * count);
    if (!result) {
        PyBuffer_Release(&view);
        return NULL;
    }
    uint8_t *begin = (uint8_t *)PyBytes_AS_STRING(result), *o = begin;
    int r;
    Py_BEGIN_ALLOW_THREADS r = scan((const uint8_t *)view.buf, view.len, count, &o, &top, NULL, &f);
    Py_END_ALLOW_THREADS PyBuffer_Release(&view);
    if (r < 0) {
        Py_DECREF(result);
        return fault_tuple(&f);
    }
    if (_PyBytes_Resize(&result, (Py_ssize_t)(o - begin)) < 0)
        return NULL;
    return result;
}

static PyMethodDef methods[] = {
    {"check", check, METH_VARARGS,
     "check(body, count[, start[, keys]]): the largest timestamp delta (with keys: and the keyless records), "
     "or (code, record, message)."},
    {"values", values, METH_VARARGS, "values(body, count): the values, length-prefixed, or (code, record, message)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "luxun._records",
                                    "Kafka v2 records checked and read in C (see luxun/records.py).", -1, methods};

PyMODINIT_FUNC PyInit__records(void) { return PyModule_Create(&module); }
