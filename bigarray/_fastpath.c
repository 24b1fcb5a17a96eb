/* bigarray._fastpath: the inlined paths of BigArray.append, BigArray.get and
 * FanoutQueue.dequeue in C, for callers that hold an item or a request in memory of their
 * own (luxun's compiled loop answers a canonical produce or one-item consume without
 * making Python objects for the request or running the interpreter's loop).
 *
 *   append(array, item) -> int: the index appended, or -1 when the inlined path does not
 *       apply (nothing was appended; BigArray.append takes it then);
 *   get(array, index) -> bytes | None: None when the fast path does not apply;
 *   dequeue(queue, group) -> bytes | None: None when the fast path does not apply
 *       (nothing moved).
 *
 * The capsule ``bigarray._fastpath._C_API`` holds a ``BigArrayFastAPI`` (_fastpath.h).
 *
 * Each is the twin of its Python path's first branch, step for step, on the same
 * attributes, with the interpreter held throughout (so no other thread runs between the
 * steps, as under the Python path's GIL and locks):
 * - append (bigarray.write.ArrayWrites.append): the array's lock is taken without waiting
 *   (not taken when another thread holds it); the item must fit the room
 *   _arm_fast_append set (_data_fast_end, _index_fast_end), be under 64 KiB; its bytes are
 *   copied into the head data page's mapping, its index item (page, offset, length,
 *   timestamp, aux 0) written, _data_off, _next_offset and _head moved, and head stored in
 *   the meta page, the commit point.
 * - get (bigarray.read.ArrayReads.get): an index in [tail, head) on the index and data
 *   pages of the previous read (_read_index_page, _read_data_page), copied out.
 * - dequeue (bigarray.fanout.FanoutQueue.dequeue): a known group, open and not committed,
 *   its lock taken without waiting, its next index read as get's fast path reads it; the
 *   group's position stored in its page and in memory; then _maybe_cleanup() as there.
 * tests/bigarray/test_fastpath.py compares each with its Python path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_fastpath.h"

/* Single items this big go to BigArray.append (which writes those of
 * bigarray.write._WRITE_THROUGH_FILE_MIN_SINGLE, 32 KiB, or more into the page file): the
 * ones in between are copied into the mapping here, as append did before 2026-11-29 (the
 * bytes stored are the same). Measured (2026-11-29, a broker taking Thrift sync produce,
 * busy polling on, 2 s, this limit at 64 and at 32 KiB alternately): sending 32-64 KiB
 * items to BigArray.append saves the zeroing of the pages the mapping's copy faults in,
 * but costs one client the Python path's latency: 1 client, 40 KB 6.5-6.9 -> 6.0-6.5 k
 * calls/s at 141-146 -> 92-102 us of broker CPU a call, 60 KB 6.7-7.0 -> 4.9-6.2 k at
 * 135-143 -> 99-112 us; 4 clients, 40 KB 8.2-8.8 -> 9.5-10.0 k at 88-100 us both. */
#define WRITE_THROUGH_FILE_MIN_SINGLE (64 << 10)

static PyObject *s_lock, *s_acquire, *s_release, *s_data_off, *s_data_fast_end, *s_head, *s_index_fast_end,
    *s_data_mm, *s_index_mm, *s_last_ts, *s_data_page_no, *s_next_offset, *s_head_cell, *s_tail, *s_read_index_page,
    *s_read_data_page, *s_page_no, *s_mm, *s_groups, *s_array, *s_closed, *s_committed, *s_index, *s_cell,
    *s_auto_cleanup, *s_maybe_cleanup, *s_group_lock;
static long long g_slot_mask, g_slot_bits, g_page_bits;

static void put_be(unsigned char *p, uint64_t v, int size) {
    for (int i = size - 1; i >= 0; i--, v >>= 8) p[i] = (unsigned char)v;
}

static uint64_t get_be(const unsigned char *p, int size) {
    uint64_t v = 0;
    for (int i = 0; i < size; i++) v = (v << 8) | p[i];
    return v;
}

/* Store v as a big-endian i64 in the 8-byte writable buffer of obj (a BE_I64 cell over a
 * mapping: head in the meta page, a group's position): 0, or -1 with an exception. */
static int store_cell(PyObject *obj, long long v) {
    Py_buffer cell;
    if (PyObject_GetBuffer(obj, &cell, PyBUF_WRITABLE) < 0) return -1;
    int rc = 0;
    if (cell.len != 8) {
        PyErr_SetString(PyExc_RuntimeError, "bigarray._fastpath: a position cell is not 8 bytes");
        rc = -1;
    } else {
        unsigned char be[8];
        put_be(be, (uint64_t)v, 8);
        memcpy(cell.buf, be, 8);
    }
    PyBuffer_Release(&cell);
    return rc;
}

/* lock.acquire(False): 1 taken, 0 held by another thread, -1 an exception. */
static int try_lock(PyObject *lock) {
    PyObject *got = PyObject_CallMethodOneArg(lock, s_acquire, Py_False);
    if (got == NULL) return -1;
    int taken = got == Py_True;
    Py_DECREF(got);
    return taken;
}

/* lock.release(), keeping the exception set (if any) as it was: 0, or -1 (release failed). */
static int unlock(PyObject *lock) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *released = PyObject_CallMethodNoArgs(lock, s_release);
    if (released == NULL) { /* cannot happen: this thread holds it */
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return -1;
    }
    Py_DECREF(released);
    PyErr_Restore(type, value, tb);
    return 0;
}

/* The steps of append under the lock: 1 appended (*index), 0 not taken, -1 failed before
 * the item was written (an exception set), -2 failed after. */
static int append_locked(PyObject *array, const char *item, Py_ssize_t n, long long *index) {
    long long off, fast_end, idx, index_fast_end, last_ts, page_no;
    if (get_ll(array, s_data_off, &off) < 0 || get_ll(array, s_data_fast_end, &fast_end) < 0 ||
        get_ll(array, s_head, &idx) < 0 || get_ll(array, s_index_fast_end, &index_fast_end) < 0)
        return -1;
    long long end = off + n;
    if (end > fast_end || idx >= index_fast_end || n >= WRITE_THROUGH_FILE_MIN_SINGLE) return 0;
    if (get_ll(array, s_last_ts, &last_ts) < 0 || get_ll(array, s_data_page_no, &page_no) < 0) return -1;
    PyObject *data_mm = PyObject_GetAttr(array, s_data_mm);
    if (data_mm == NULL) return -1;
    PyObject *index_mm = PyObject_GetAttr(array, s_index_mm);
    PyObject *cell = index_mm == NULL ? NULL : PyObject_GetAttr(array, s_head_cell);
    Py_buffer data, ix;
    data.obj = ix.obj = NULL;
    int rc = -1;
    if (cell == NULL || PyObject_GetBuffer(data_mm, &data, PyBUF_WRITABLE) < 0 ||
        PyObject_GetBuffer(index_mm, &ix, PyBUF_WRITABLE) < 0)
        goto done;
    long long slot_at = (idx & g_slot_mask) << g_slot_bits;
    if (off < 0 || end > data.len || slot_at + 32 > ix.len) {
        PyErr_SetString(PyExc_RuntimeError, "bigarray._fastpath: the array's fast append room is out of its pages");
        goto done;
    }
    memcpy((char *)data.buf + off, item, (size_t)n);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns() // 1_000_000, as now_ms() */
    long long ms = (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    rc = -2;
    if (ms < last_ts)
        ms = last_ts;
    else if (set_ll(array, s_last_ts, ms) < 0)
        goto done;
    unsigned char *slot = (unsigned char *)ix.buf + slot_at; /* codec.pack_plain_index_item */
    put_be(slot, (uint64_t)page_no, 8);
    put_be(slot + 8, (uint64_t)off, 4);
    put_be(slot + 12, (uint64_t)n, 4);
    put_be(slot + 16, (uint64_t)ms, 8);
    memset(slot + 24, 0, 8);
    if (set_ll(array, s_data_off, end) < 0 || set_ll(array, s_next_offset, idx + 1) < 0 || /* before head */
        set_ll(array, s_head, idx + 1) < 0 || store_cell(cell, idx + 1) < 0) /* the commit point */
        goto done;
    *index = idx;
    rc = 1;
done:
    if (ix.obj) PyBuffer_Release(&ix);
    if (data.obj) PyBuffer_Release(&data);
    Py_XDECREF(cell);
    Py_XDECREF(index_mm);
    Py_DECREF(data_mm);
    return rc;
}

static long long append_raw(PyObject *array, const char *item, Py_ssize_t n) {
    PyObject *lock = PyObject_GetAttr(array, s_lock);
    if (lock == NULL) return -2;
    int taken = try_lock(lock);
    if (taken <= 0) { /* another thread appends, or closes: BigArray.append waits for it */
        Py_DECREF(lock);
        return taken < 0 ? -2 : -1;
    }
    long long index = -1;
    int rc = append_locked(array, item, n, &index);
    int released = unlock(lock);
    Py_DECREF(lock);
    if (released < 0) return -2;
    if (rc == 1) return index;
    if (rc == -2) return -2;
    PyErr_Clear(); /* nothing was written: the general path will say what is wrong, if anything */
    return -1;
}

/* The index item at index on the index page of the last read, and its bytes on the data
 * page of the last read: a new bytes object, or NULL, with an exception only when the
 * copy failed (every other failure is "not here": the Python path maps pages, checks and
 * raises). head: the caller read it (-1: read it here). */
static PyObject *read_cached(PyObject *array, long long index, long long head) {
    long long tail, page_no, want;
    PyObject *ipage = NULL, *dpage = NULL, *mm = NULL, *item = NULL;
    Py_buffer view;
    view.obj = NULL;
    if ((ipage = PyObject_GetAttr(array, s_read_index_page)) == NULL || get_ll(ipage, s_page_no, &page_no) < 0 ||
        page_no != index >> g_page_bits || get_ll(array, s_tail, &tail) < 0 || index < tail ||
        (head < 0 && get_ll(array, s_head, &head) < 0) || index >= head)
        goto none;
    if ((mm = PyObject_GetAttr(ipage, s_mm)) == NULL || PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE) < 0) goto none;
    long long slot_at = (index & g_slot_mask) << g_slot_bits;
    if (slot_at + 16 > view.len) goto none;
    const unsigned char *slot = (const unsigned char *)view.buf + slot_at; /* codec.unpack_item_place */
    want = (long long)get_be(slot, 8);
    long long off = (int32_t)get_be(slot + 8, 4), length = (int32_t)get_be(slot + 12, 4);
    PyBuffer_Release(&view);
    Py_CLEAR(mm);
    if ((dpage = PyObject_GetAttr(array, s_read_data_page)) == NULL || get_ll(dpage, s_page_no, &page_no) < 0 ||
        page_no != want || (mm = PyObject_GetAttr(dpage, s_mm)) == NULL ||
        PyObject_GetBuffer(mm, &view, PyBUF_SIMPLE) < 0)
        goto none;
    if (off >= 0 && length >= 0 && off + length <= view.len)
        item = PyBytes_FromStringAndSize((const char *)view.buf + off, length);
    else
        PyErr_Clear();
    goto done;
none:
    PyErr_Clear();
done:
    if (view.obj) PyBuffer_Release(&view);
    Py_XDECREF(mm);
    Py_XDECREF(dpage);
    Py_XDECREF(ipage);
    return item;
}

static PyObject *get_raw(PyObject *array, long long index) { return read_cached(array, index, -1); }

static PyObject *dequeue_raw(PyObject *queue, PyObject *group) {
    PyObject *groups = PyObject_GetAttr(queue, s_groups), *g = NULL;
    if (groups != NULL) {
        g = PyDict_GetItemWithError(groups, group);
        Py_XINCREF(g);
        Py_DECREF(groups);
    }
    if (g == NULL) { /* a group not known yet: dequeue makes it */
        PyErr_Clear();
        return NULL;
    }
    PyObject *array = NULL, *lock = NULL, *v = NULL, *cell = NULL, *item = NULL;
    int failed = 0; /* an exception to raise: the copy, or the move, failed */
    long long index, head;
    if ((array = PyObject_GetAttr(queue, s_array)) == NULL || (lock = PyObject_GetAttr(g, s_group_lock)) == NULL ||
        try_lock(lock) <= 0)
        goto out;
    /* Under the group's lock: open, not committed, behind head, on the pages of the last read. */
    if ((v = PyObject_GetAttr(g, s_closed)) != NULL && PyObject_IsTrue(v) == 0) {
        Py_CLEAR(v);
        if ((v = PyObject_GetAttr(g, s_committed)) == Py_None && get_ll(g, s_index, &index) == 0 &&
            get_ll(array, s_head, &head) == 0 && index < head) {
            item = read_cached(array, index, head);
            failed = item == NULL && PyErr_Occurred();
            /* g.move(index + 1), inlined as dequeue does: the page, then memory */
            if (item != NULL && ((cell = PyObject_GetAttr(g, s_cell)) == NULL || store_cell(cell, index + 1) < 0 ||
                                 set_ll(g, s_index, index + 1) < 0)) {
                Py_CLEAR(item);
                failed = 1;
            }
        }
    }
    Py_CLEAR(v);
    if (!failed) PyErr_Clear();
    if (unlock(lock) < 0) {
        Py_CLEAR(item);
        failed = 1;
    }
out:
    if (!failed) PyErr_Clear();
    Py_XDECREF(cell);
    Py_XDECREF(lock);
    Py_XDECREF(array);
    Py_DECREF(g);
    if (item == NULL) return NULL;
    /* After the group's lock, as dequeue: the pages every group has read may go. */
    int cleanup = (v = PyObject_GetAttr(queue, s_auto_cleanup)) == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    PyObject *r = cleanup > 0 ? PyObject_CallMethodNoArgs(queue, s_maybe_cleanup) : NULL;
    Py_XDECREF(r);
    if (PyErr_Occurred()) /* the item is the caller's now: the group moved past it */
        PyErr_WriteUnraisable(queue);
    return item;
}

static PyObject *py_append(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append(array, item) takes two arguments");
        return NULL;
    }
    Py_buffer item;
    if (PyObject_GetBuffer(args[1], &item, PyBUF_SIMPLE) < 0) return NULL;
    long long index = append_raw(args[0], item.buf, item.len);
    PyBuffer_Release(&item);
    if (index == -2) return NULL;
    return PyLong_FromLongLong(index);
}

static PyObject *none_or(PyObject *item) {
    if (item != NULL || PyErr_Occurred()) return item;
    Py_RETURN_NONE;
}

static PyObject *py_get(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "get(array, index) takes two arguments");
        return NULL;
    }
    long long index = PyLong_AsLongLong(args[1]);
    if (index == -1 && PyErr_Occurred()) return NULL;
    return none_or(get_raw(args[0], index));
}

static PyObject *py_dequeue(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "dequeue(queue, group) takes a queue and a str");
        return NULL;
    }
    return none_or(dequeue_raw(args[0], args[1]));
}

static BigArrayFastAPI api = {append_raw, get_raw, dequeue_raw, try_lock, unlock};

static PyMethodDef methods[] = {
    {"append", (PyCFunction)(void (*)(void))py_append, METH_FASTCALL,
     "append(array, item) -> index, or -1 when BigArray.append's inlined path does not apply"},
    {"get", (PyCFunction)(void (*)(void))py_get, METH_FASTCALL,
     "get(array, index) -> bytes, or None when BigArray.get's fast path does not apply"},
    {"dequeue", (PyCFunction)(void (*)(void))py_dequeue, METH_FASTCALL,
     "dequeue(queue, group) -> bytes, or None when FanoutQueue.dequeue's fast path does not apply"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "bigarray._fastpath", "The inlined paths of append, get and dequeue in C (see _fastpath.c).",
    -1, methods, NULL, NULL, NULL, NULL};

static int intern(PyObject **slot, const char *name) {
    return (*slot = PyUnicode_InternFromString(name)) == NULL ? -1 : 0;
}

static int codec_int(PyObject *codec, const char *name, long long *out) {
    PyObject *v = PyObject_GetAttrString(codec, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

PyMODINIT_FUNC PyInit__fastpath(void) {
    static const char *names[] = {"_lock", "acquire", "release", "_data_off", "_data_fast_end", "_head",
                                  "_index_fast_end", "_data_mm", "_index_mm", "_last_ts", "_data_page_no",
                                  "_next_offset", "_head_cell", "_tail", "_read_index_page", "_read_data_page",
                                  "page_no", "mm", "_groups", "array", "closed", "committed", "index", "cell",
                                  "_auto_cleanup", "_maybe_cleanup", "lock"};
    PyObject **slots[] = {&s_lock, &s_acquire, &s_release, &s_data_off, &s_data_fast_end, &s_head,
                          &s_index_fast_end, &s_data_mm, &s_index_mm, &s_last_ts, &s_data_page_no,
                          &s_next_offset, &s_head_cell, &s_tail, &s_read_index_page, &s_read_data_page,
                          &s_page_no, &s_mm, &s_groups, &s_array, &s_closed, &s_committed, &s_index, &s_cell,
                          &s_auto_cleanup, &s_maybe_cleanup, &s_group_lock};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (intern(slots[i], names[i]) < 0) return NULL;
    /* The slot arithmetic of bigarray.codec, read from it (one definition). */
    PyObject *codec = PyImport_ImportModule("bigarray.codec");
    if (codec == NULL) return NULL;
    int rc = codec_int(codec, "SLOT_MASK", &g_slot_mask) | codec_int(codec, "SLOT_BITS", &g_slot_bits) |
             codec_int(codec, "PAGE_BITS", &g_page_bits);
    Py_DECREF(codec);
    if (rc) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    PyObject *capsule = PyCapsule_New(&api, "bigarray._fastpath._C_API", NULL);
    if (capsule == NULL || PyModule_AddObject(m, "_C_API", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
