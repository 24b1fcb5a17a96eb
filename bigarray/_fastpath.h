/* bigarray._fastpath's C API: the capsule bigarray._fastpath._C_API holds one of these.
 * Every function needs the interpreter held. */
#ifndef BIGARRAY_FASTPATH_H
#define BIGARRAY_FASTPATH_H

typedef struct {
    /* BigArray.append's inlined path for item[0:n): >= 0 the index appended; -1 not taken
     * (nothing appended, no exception: BigArray.append takes it); -2 an exception is set
     * (after the item was written: a failed append). */
    long long (*append)(PyObject *array, const char *item, Py_ssize_t n);
    /* BigArray.get's fast path: a new bytes object, or NULL: not taken (no exception:
     * BigArray.get answers, an error included) or an exception. */
    PyObject *(*get)(PyObject *array, long long index);
    /* FanoutQueue.dequeue's fast path, for a str group: a new bytes object (the group
     * moved past it), or NULL: not taken (nothing moved, no exception: dequeue answers)
     * or an exception. */
    PyObject *(*dequeue)(PyObject *queue, PyObject *group);
    /* lock.acquire(False): 1 taken, 0 held by another thread, -1 an exception. */
    int (*try_lock)(PyObject *lock);
    /* lock.release(), keeping the exception set (if any): 0, or -1 (release failed). */
    int (*unlock)(PyObject *lock);
} BigArrayFastAPI;

/* An int attribute of obj, read or written (both modules use them). */
static inline int get_ll(PyObject *obj, PyObject *name, long long *out) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    *out = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

static inline int set_ll(PyObject *obj, PyObject *name, long long value) {
    PyObject *v = PyLong_FromLongLong(value);
    if (v == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, v);
    Py_DECREF(v);
    return rc;
}

#endif
