/* luxun._netloop: the compiled parts of a connection's loop.
 *
 * note(ident): the thread that received bytes last (luxun.net's RECEIVING mirrors each
 * change here, so that a busy poll, which runs without the interpreter, sees it).
 *
 * Loop(poll_us, metrics, here, follow=False): the shared loop, one thread serving every
 * parked connection's common calls in place (see "The shared loop" below); what the Thrift
 * door uses by default.
 *
 * serve(fd, buf, me, poll_us, hold, idle, note, metrics, produce_item, produce_reply,
 *       consume_single, here) -> int
 *
 * The Thrift door's small sync calls without the interpreter's loop. A connection
 * thread (``me``: its threading.get_ident()) calls it when it holds no input
 * (luxun.thrift.server, "The compiled loop"). It waits for bytes with poll() and takes
 * them with recv() with the interpreter released, calling hold() between the two and
 * note() after (ConnInput's rules: bytes leave the kernel only while the connection
 * holds). After a reply under 256 KiB it busy polls as the Python loop does (``poll_us``
 * > 0; the same rules: only a connection that has been the only one receiving for 50 ms,
 * runs of polls of at most 2 ms; counted in ``metrics.busy_polls`` and
 * ``metrics.busy_poll_hits``), with the interpreter released, and stops as soon as
 * another thread notes that it received bytes. Each call it answers is counted in
 * ``metrics.compiled_loop_calls``. When what came is exactly one call
 * frame, a `produce` or a one-item `consume` in the canonical layout (the layouts of
 * luxun.thrift.wire.parse_produce_call and parse_consume_call), it calls the handler with
 * the interpreter (produce_item(topic, item) -> (Result, index); consume_single(fields)
 * -> (item, lastConsumedIndex) or None) unless it serves the call in place (``here``:
 * QueueHandler.in_place_calls(), see append_here and consume_here), writes the reply itself (the bytes of
 * wire.produce_reply_frame / wire.consume_one_reply_frame; produce_reply(seqid, result,
 * index) writes a produce reply other than a success), sends it with the interpreter
 * released, calls idle(), and waits again. Anything else (another call, several frames,
 * part of one, a consume that consume_single leaves alone) is left in buf: it returns
 * how many bytes it received there (the connection still holding), and the Python loop
 * handles them. 0: the peer closed (or the server shut the socket down). OSError on a
 * failed poll, recv or send.
 *
 * Why: on this 2-core VM a sync call costs a thread-per-connection server about 26 us of
 * CPU in the kernel alone (perf/bench_broker.py's floor-c), a Python one 34-37 us
 * (floor-raw); ours spent 43-50 us, Java Luxun 30-35 (see perf/README.md).
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <sched.h>
#include <poll.h>
#include <semaphore.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "../bigarray/_fastpath.h"

/* Busy polling's rules: luxun.thrift.server's _BUSY_POLL_QUIET_S, _BUSY_POLL_RUN_S,
 * _BUSY_POLL_REPLY_MAX. */
#define QUIET_NS 50000000LL
#define RUN_NS 2000000LL
#define POLL_REPLY_MAX (256 * 1024)

/* The thread that received bytes last, and since when (CLOCK_MONOTONIC ns): written by
 * note() with the interpreter held, read by busy polls without it. */
static unsigned long g_ident;
static long long g_since;

static long long mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static const unsigned char CALL_HEAD[4] = {0x80, 0x01, 0x00, 0x01};
static const unsigned char PRODUCE_NAME[11] = {0, 0, 0, 7, 'p', 'r', 'o', 'd', 'u', 'c', 'e'};
static const unsigned char CONSUME_NAME[11] = {0, 0, 0, 7, 'c', 'o', 'n', 's', 'u', 'm', 'e'};
static const unsigned char ARGS_ITEM[6] = {0x0c, 0, 1, 0x0b, 0, 1};
static const unsigned char ARGS_STRUCT[3] = {0x0c, 0, 1};
static const unsigned char TOPIC_FIELD[3] = {0x0b, 0, 2};

static PyObject *s_resultCode, *s_errorCode, *s_errorMessage, *s_busy_polls, *s_busy_poll_hits, *s_calls, *s_in_place,
    *s_cpu_follows;
static PyObject *k_fields[6]; /* ConsumeRequest's attribute names by field id (1-5) */
static PyObject *s_flush_count, *s_max_message_size, *s_queue, *s_array, *s_used, *s_stats, *s_items_in, *s_bytes_in,
    *s_waiters, *s_watchers, *s_notify, *s_produce, *s_items_out, *s_bytes_out, *s_consume, *s__lock, *s__calls,
    *s_count, *s_sum_s, *s_buckets, *s_phase, *s_busy, *s_ident, *s_since;

/* bigarray._fastpath's C API (bigarray/_fastpath.c); NULL where it is not built. */
static const BigArrayFastAPI *g_bigarray;

static int32_t get_i32(const unsigned char *p) {
    return (int32_t)(((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3]);
}

static int64_t get_i64(const unsigned char *p) {
    return (int64_t)(((uint64_t)(uint32_t)get_i32(p) << 32) | (uint32_t)get_i32(p + 4));
}

static void put_i32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void put_i64(unsigned char *p, int64_t v) {
    put_i32(p, (uint32_t)((uint64_t)v >> 32));
    put_i32(p + 4, (uint32_t)(uint64_t)v);
}

/* Advance iov[0..*n) past k bytes sent. */
static struct iovec *advance(struct iovec *iov, int *n, size_t k) {
    while (*n > 0 && k >= iov->iov_len) {
        k -= iov->iov_len;
        iov++;
        (*n)--;
    }
    if (*n > 0) {
        iov->iov_base = (char *)iov->iov_base + k;
        iov->iov_len -= k;
    }
    return iov;
}

static ssize_t send_iov(int fd, struct iovec *iov, int n, int flags) {
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)n;
    return sendmsg(fd, &msg, MSG_NOSIGNAL | flags);
}

/* Send every byte of iov[0..n): 0, or -1 with errno set. First without waiting and with
 * the interpreter held (a small reply fits the socket's buffer: no hand-over of the
 * interpreter, which other connections' threads would otherwise take in between, each
 * hand-over a wake-up), then what is left with the interpreter released. */
static int send_all(int fd, struct iovec *iov, int n) {
    ssize_t k;
    do {
        k = send_iov(fd, iov, n, MSG_DONTWAIT);
    } while (k < 0 && errno == EINTR);
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
    if (k > 0) iov = advance(iov, &n, (size_t)k);
    if (n == 0) return 0;
    int rc = 0;
    Py_BEGIN_ALLOW_THREADS
    while (n > 0) {
        k = send_iov(fd, iov, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            rc = -1;
            break;
        }
        iov = advance(iov, &n, (size_t)k);
    }
    Py_END_ALLOW_THREADS
    return rc;
}

static int call0(PyObject *fn) {
    PyObject *r = PyObject_CallNoArgs(fn);
    if (r == NULL) return -1;
    Py_DECREF(r);
    return 0;
}

/* 1: a Result of success (resultCode 0, no errorCode or errorMessage), 0 another, -1 error. */
static int is_success(PyObject *result) {
    PyObject *code = PyObject_GetAttr(result, s_resultCode);
    if (code == NULL) return -1;
    int ok = 0;
    if (PyLong_Check(code) && PyLong_AsLong(code) == 0) {
        PyObject *e = PyObject_GetAttr(result, s_errorCode);
        PyObject *m = e == NULL ? NULL : PyObject_GetAttr(result, s_errorMessage);
        ok = m == NULL ? -1 : e == Py_None && m == Py_None;
        Py_XDECREF(e);
        Py_XDECREF(m);
    }
    Py_DECREF(code);
    return ok;
}

static int add_to(PyObject *obj, PyObject *name, long n) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL) return -1;
    PyObject *one = PyLong_FromLong(n);
    PyObject *sum = one == NULL ? NULL : PyNumber_Add(v, one);
    Py_DECREF(v);
    Py_XDECREF(one);
    if (sum == NULL) return -1;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc;
}

/* The calls served here, without the handler: ctx is QueueHandler.in_place_calls()'s
 * (open topics by name, TopicManager, QueueHandler, Metrics.observe,
 * QueueHandler._batches_as_packs, and a Kafka batch's header size, magic offset and magic
 * for _may_be_batch), or None: never. */
enum {
    CTX_OPEN,
    CTX_TOPICS,
    CTX_HANDLER,
    CTX_OBSERVE,
    CTX_AS_PACKS,
    CTX_HEADER,
    CTX_MAGIC_AT,
    CTX_MAGIC,
    CTX_METRICS,
    CTX_BOUNDS,
    CTX_SIZE
};

/* Metrics.observe(call, seconds, None)'s twin (luxun.metrics): under the metrics' lock, taken
 * without waiting, a call of a method already counted. 1 done, 0 not (observe does it), -1
 * an exception. */
static int observe_here(PyObject *ctx, PyObject *call, double seconds) {
    if (g_bigarray == NULL) return 0; /* its lock helpers are bigarray._fastpath's */
    PyObject *metrics = PyTuple_GET_ITEM(ctx, CTX_METRICS), *bounds = PyTuple_GET_ITEM(ctx, CTX_BOUNDS);
    PyObject *lock = PyObject_GetAttr(metrics, s__lock), *calls = NULL, *sum = NULL, *buckets = NULL;
    if (lock == NULL) return -1;
    int taken = g_bigarray->try_lock(lock);
    if (taken <= 0) {
        Py_DECREF(lock);
        return taken;
    }
    int rc = -1;
    PyObject *stats = (calls = PyObject_GetAttr(metrics, s__calls)) == NULL ? NULL : PyDict_GetItemWithError(calls, call);
    if (stats == NULL) {
        rc = PyErr_Occurred() ? -1 : 0; /* a method not counted yet: observe makes its stats */
        goto out;
    }
    Py_ssize_t i = 0, n = PyTuple_GET_SIZE(bounds); /* bisect.bisect_left(LATENCY_BUCKETS_S, seconds) */
    while (i < n && PyFloat_AsDouble(PyTuple_GET_ITEM(bounds, i)) < seconds) i++;
    double total;
    if (add_to(stats, s_count, 1) < 0 || (sum = PyObject_GetAttr(stats, s_sum_s)) == NULL ||
        ((total = PyFloat_AsDouble(sum)) == -1.0 && PyErr_Occurred()))
        goto out;
    Py_SETREF(sum, PyFloat_FromDouble(total + seconds));
    if (sum == NULL || PyObject_SetAttr(stats, s_sum_s, sum) < 0 || (buckets = PyObject_GetAttr(stats, s_buckets)) == NULL)
        goto out;
    if (!PyList_Check(buckets) || i >= PyList_GET_SIZE(buckets)) {
        PyErr_SetString(PyExc_TypeError, "observe_here: a call's buckets are not a list of LATENCY_BUCKETS_S + 1");
        goto out;
    }
    long long count = PyLong_AsLongLong(PyList_GET_ITEM(buckets, i));
    PyObject *one_more = count == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(count + 1);
    if (one_more == NULL || PyList_SetItem(buckets, i, one_more) < 0) goto out;
    rc = 1;
out:
    Py_XDECREF(buckets);
    Py_XDECREF(sum);
    Py_XDECREF(calls);
    if (g_bigarray->unlock(lock) < 0) rc = -1;
    Py_DECREF(lock);
    return rc;
}

/* A call served here since t0 (CLOCK_MONOTONIC ns), observed as Metrics.observe does it. */
static int observe(PyObject *ctx, PyObject *call, long long t0) {
    double s = (double)(mono_ns() - t0) / 1e9;
    int done = observe_here(ctx, call, s);
    if (done != 0) return done < 0 ? -1 : 0;
    PyObject *seconds = PyFloat_FromDouble(s);
    if (seconds == NULL) return -1;
    PyObject *r = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(ctx, CTX_OBSERVE), call, seconds, Py_None, NULL);
    Py_DECREF(seconds);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The produce of one item to an open topic, appended here: the twin of what
 * QueueHandler.produce_item does through TopicManager.append when the item is within
 * max_message_size, the topic is open, flush_count is off and the array's inlined append
 * path takes it (bigarray._fastpath). 1 appended at *index, 0 not taken (nothing done:
 * produce_item answers), -1 error. */
static int append_here(PyObject *ctx, PyObject *name, const char *item, Py_ssize_t n, long long *index) {
    if (ctx == Py_None || g_bigarray == NULL) return 0;
    long long t0 = mono_ns(), flush_count, limit;
    PyObject *topic = PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, CTX_OPEN), name);
    if (topic == NULL) return PyErr_Occurred() ? -1 : 0; /* not open: created, or refused, there */
    if (get_ll(PyTuple_GET_ITEM(ctx, CTX_TOPICS), s_flush_count, &flush_count) < 0 ||
        get_ll(PyTuple_GET_ITEM(ctx, CTX_HANDLER), s_max_message_size, &limit) < 0)
        return -1;
    if (flush_count > 0 || n > limit) return 0;
    Py_INCREF(topic);
    int rc = -1;
    PyObject *queue = PyObject_GetAttr(topic, s_queue), *array = NULL, *stats = NULL, *waits = NULL, *r = NULL;
    if (queue == NULL || (array = PyObject_GetAttr(queue, s_array)) == NULL) goto done;
    long long idx = g_bigarray->append(array, item, n);
    if (idx == -2) goto done;
    rc = 0;
    if (idx == -1) goto done; /* a new page, a closed array, another thread appending...: there */
    rc = -1;
    /* TopicManager.append's steps after its append: used, stats, waking the waiters. */
    if (PyObject_SetAttr(topic, s_used, Py_True) < 0 || (stats = PyObject_GetAttr(topic, s_stats)) == NULL ||
        add_to(stats, s_items_in, 1) < 0 || add_to(stats, s_bytes_in, (long)n) < 0)
        goto done;
    int wake = 0;
    if ((waits = PyObject_GetAttr(topic, s_waiters)) == NULL || (wake = PyObject_IsTrue(waits)) < 0) goto done;
    Py_CLEAR(waits);
    if (!wake && ((waits = PyObject_GetAttr(topic, s_watchers)) == NULL || (wake = PyObject_IsTrue(waits)) < 0))
        goto done;
    if (wake && (r = PyObject_CallMethodNoArgs(topic, s_notify)) == NULL) goto done;
    Py_CLEAR(r);
    if (observe(ctx, s_produce, t0) < 0) goto done;
    *index = idx;
    rc = 1;
done:
    Py_XDECREF(r);
    Py_XDECREF(waits);
    Py_XDECREF(stats);
    Py_XDECREF(array);
    Py_XDECREF(queue);
    Py_DECREF(topic);
    return rc;
}

/* One produce frame body [p, p+n): 1 handled (reply sent), 0 not canonical, -1 error.
 * produce_item and produce_reply NULL (the shared loop): only an append in place is served. */
static int serve_produce(int fd, const unsigned char *p, Py_ssize_t n, PyObject *produce_item,
                         PyObject *produce_reply, PyObject *here_ctx, PyObject *metrics) {
    /* head 4 | name 11 | seqid 4 | ARGS_ITEM 6 | item length 4 | item | TOPIC 3 | length 4 | topic | 0 0 */
    if (n < 4 + 11 + 4 + 6 + 4 + 3 + 4 + 2 || memcmp(p, CALL_HEAD, 4) || memcmp(p + 4, PRODUCE_NAME, 11) ||
        memcmp(p + 19, ARGS_ITEM, 6))
        return 0;
    int32_t seqid = get_i32(p + 15);
    int32_t item_len = get_i32(p + 25);
    if (item_len < 0 || 29 + (Py_ssize_t)item_len + 7 + 2 > n) return 0;
    const unsigned char *t = p + 29 + item_len;
    int32_t topic_len = get_i32(t + 3);
    if (memcmp(t, TOPIC_FIELD, 3) || topic_len < 0 || 29 + (Py_ssize_t)item_len + 7 + topic_len + 2 != n ||
        p[n - 2] || p[n - 1])
        return 0;
    PyObject *topic = PyUnicode_DecodeUTF8((const char *)t + 7, topic_len, NULL);
    if (topic == NULL) {
        PyErr_Clear(); /* not UTF-8: the generic path answers it */
        return 0;
    }
    PyObject *reply = NULL, *r = NULL;
    Py_buffer view;
    view.obj = NULL;
    long long i = -1;
    int ok = append_here(here_ctx, topic, (const char *)p + 29, item_len, &i); /* 1: a success */
    if (ok == 1 && add_to(metrics, s_in_place, 1) < 0) ok = -1;
    if (ok == 0 && produce_item == NULL) { /* the shared loop: the Python loop calls the handler */
        Py_DECREF(topic);
        return 0;
    }
    if (ok == 0) { /* the handler's way: produce_item(topic, item) -> (Result, index) */
        PyObject *item = PyBytes_FromStringAndSize((const char *)p + 29, item_len);
        r = item == NULL ? NULL : PyObject_CallFunctionObjArgs(produce_item, topic, item, NULL);
        Py_XDECREF(item);
        if (r != NULL && (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2)) {
            PyErr_SetString(PyExc_TypeError, "produce_item must return (Result, index)");
            goto fail;
        }
        ok = r == NULL ? -1 : is_success(PyTuple_GET_ITEM(r, 0));
        if (ok == 1) {
            i = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
            if (i == -1 && PyErr_Occurred()) ok = -1;
        }
    }
    Py_CLEAR(topic);
    if (ok < 0) goto fail;
    unsigned char out[4 + 4 + 11 + 4 + 6 + 8 + 3 + 8 + 2];
    struct iovec iov[1];
    if (ok) {
        unsigned char *o = out;
        put_i32(o, sizeof out - 4);
        memcpy(o + 4, "\x80\x01\x00\x02", 4);
        memcpy(o + 8, PRODUCE_NAME, 11);
        put_i32(o + 19, (uint32_t)seqid);
        memcpy(o + 23, "\x0c\x00\x00\x0c\x00\x01", 6);
        memcpy(o + 29, "\x08\x00\x01\x00\x00\x00\x00\x00", 8);
        memcpy(o + 37, "\x0a\x00\x02", 3);
        put_i64(o + 40, i);
        o[48] = o[49] = 0;
        iov[0].iov_base = out;
        iov[0].iov_len = sizeof out;
    } else {
        PyObject *s = PyLong_FromLong(seqid);
        if (s == NULL) goto fail;
        reply = PyObject_CallFunctionObjArgs(produce_reply, s, PyTuple_GET_ITEM(r, 0), PyTuple_GET_ITEM(r, 1), NULL);
        Py_DECREF(s);
        if (reply == NULL || PyObject_GetBuffer(reply, &view, PyBUF_SIMPLE) < 0) goto fail;
        iov[0].iov_base = view.buf;
        iov[0].iov_len = (size_t)view.len;
    }
    Py_CLEAR(r);
    int rc = send_all(fd, iov, 1); /* a produce reply is small: busy polling may follow */
    int err = errno;
    if (view.obj != NULL) PyBuffer_Release(&view);
    Py_XDECREF(reply);
    if (rc < 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 1;
fail:
    Py_XDECREF(topic);
    Py_XDECREF(r);
    Py_XDECREF(reply);
    return -1;
}

/* A one-item consume read here: the twin of QueueHandler.consume_single for a request
 * whose fields (the C parser's: topic, fanoutId, startIndex, maxFetchSize <= 0, maxWaitMs)
 * name an open topic and an item that bigarray._fastpath reads at once (by group: the
 * group moves past it). A new reference to the item (*last: lastConsumedIndex), or NULL:
 * not taken (nothing read or moved: consume_single answers) or an exception. */
static PyObject *consume_here(PyObject *ctx, PyObject *fields, long long *last) {
    if (ctx == Py_None || g_bigarray == NULL) return NULL;
    long long t0 = mono_ns(), start = 0;
    PyObject *name = PyDict_GetItemWithError(fields, k_fields[1]);
    PyObject *topic = name == NULL ? NULL : PyDict_GetItemWithError(PyTuple_GET_ITEM(ctx, CTX_OPEN), name);
    if (topic == NULL) return NULL;
    PyObject *group = PyDict_GetItemWithError(fields, k_fields[2]); /* borrowed, as name */
    if (group == NULL && PyErr_Occurred()) return NULL;
    int by_group = group != NULL && PyUnicode_Check(group) && PyUnicode_GET_LENGTH(group) > 0;
    PyObject *at = by_group ? NULL : PyDict_GetItemWithError(fields, k_fields[3]);
    if (at != NULL && (start = PyLong_AsLongLong(at)) == -1 && PyErr_Occurred()) return NULL;
    Py_INCREF(topic);
    PyObject *queue = PyObject_GetAttr(topic, s_queue), *array = NULL, *item = NULL, *stats = NULL;
    if (queue == NULL) goto done;
    if (by_group) {
        item = g_bigarray->dequeue(queue, group);
    } else if ((array = PyObject_GetAttr(queue, s_array)) != NULL) {
        item = g_bigarray->get(array, start);
    }
    if (item == NULL) goto done;
    long header = PyLong_AsLong(PyTuple_GET_ITEM(ctx, CTX_HEADER)), magic_at = PyLong_AsLong(PyTuple_GET_ITEM(ctx, CTX_MAGIC_AT)),
         magic = PyLong_AsLong(PyTuple_GET_ITEM(ctx, CTX_MAGIC));
    if (PyErr_Occurred()) goto fail;
    if (PyBytes_GET_SIZE(item) >= header && (unsigned char)PyBytes_AS_STRING(item)[magic_at] == magic) {
        /* perhaps a Kafka batch: Luxun packs, as consume_single makes them */
        PyObject *from = by_group ? Py_None : PyLong_FromLongLong(start), *list = PyList_New(1), *packs = NULL;
        if (from != NULL && list != NULL) {
            PyList_SET_ITEM(list, 0, item);
            item = NULL;
            packs = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(ctx, CTX_AS_PACKS), name, queue, from, list,
                                                 by_group ? group : Py_None, NULL);
        }
        if (!by_group) Py_XDECREF(from);
        Py_XDECREF(list);
        if (packs == NULL || !PyList_Check(packs) || PyList_GET_SIZE(packs) != 1 ||
            !PyBytes_Check(PyList_GET_ITEM(packs, 0))) {
            if (packs != NULL) PyErr_SetString(PyExc_TypeError, "_batches_as_packs must answer one bytes per item");
            Py_XDECREF(packs);
            Py_XDECREF(item);
            item = NULL;
            goto done;
        }
        Py_XDECREF(item);
        item = Py_NewRef(PyList_GET_ITEM(packs, 0));
        Py_DECREF(packs);
    }
    if ((stats = PyObject_GetAttr(topic, s_stats)) == NULL || add_to(stats, s_items_out, 1) < 0 ||
        add_to(stats, s_bytes_out, (long)PyBytes_GET_SIZE(item)) < 0 || observe(ctx, s_consume, t0) < 0)
        goto fail;
    *last = by_group ? 0 : start;
    goto done;
fail:
    Py_CLEAR(item);
done:
    Py_XDECREF(stats);
    Py_XDECREF(array);
    Py_XDECREF(queue);
    Py_DECREF(topic);
    return item;
}

/* One consume frame body: 1 handled, 0 not (canonical and single, and served at once), -1 error. */
static int serve_consume(int fd, const unsigned char *p, Py_ssize_t n, PyObject *consume_single, PyObject *here_ctx,
                         PyObject *metrics) {
    if (n < 4 + 11 + 4 + 3 + 2 || memcmp(p, CALL_HEAD, 4) || memcmp(p + 4, CONSUME_NAME, 11) ||
        memcmp(p + 19, ARGS_STRUCT, 3))
        return 0;
    int32_t seqid = get_i32(p + 15);
    Py_ssize_t pos = 22;
    int last_id = 0, has_topic = 0;
    PyObject *fields = PyDict_New();
    if (fields == NULL) return -1;
    for (;;) {
        if (pos >= n) goto no;
        unsigned char type = p[pos];
        if (type == 0) {
            if (pos + 2 != n || p[pos + 1] || !has_topic) goto no;
            break;
        }
        if (pos + 3 > n) goto no;
        int id = (p[pos + 1] << 8) | p[pos + 2];
        pos += 3;
        /* 1 topic, 2 fanoutId: string; 3 startIndex: i64; 4 maxFetchSize, 5 maxWaitMs: i32 */
        static const unsigned char types[6] = {0, 11, 11, 10, 8, 8};
        if (id <= last_id || id > 5 || types[id] != type) goto no;
        last_id = id;
        PyObject *value;
        if (type == 11) {
            if (pos + 4 > n) goto no;
            int32_t len = get_i32(p + pos);
            pos += 4;
            if (len < 0 || pos + len > n) goto no;
            value = PyUnicode_DecodeUTF8((const char *)p + pos, len, NULL);
            if (value == NULL) {
                PyErr_Clear();
                goto no;
            }
            pos += len;
            has_topic |= id == 1;
        } else if (type == 10) {
            if (pos + 8 > n) goto no;
            value = PyLong_FromLongLong(get_i64(p + pos));
            pos += 8;
        } else {
            if (pos + 4 > n) goto no;
            if (id == 4 && get_i32(p + pos) > 0) goto no; /* maxFetchSize: a fetch, the Python loop's */
            value = PyLong_FromLong(get_i32(p + pos));
            pos += 4;
        }
        if (value == NULL || PyDict_SetItem(fields, k_fields[id], value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(fields);
            return -1;
        }
        Py_DECREF(value);
    }
    long long last = 0;
    PyObject *one = consume_here(here_ctx, fields, &last); /* the item, or NULL */
    if (one != NULL && add_to(metrics, s_in_place, 1) < 0) Py_CLEAR(one);
    if (one == NULL && !PyErr_Occurred() && consume_single == NULL) { /* the shared loop's: to Python */
        Py_DECREF(fields);
        return 0;
    }
    if (one == NULL && !PyErr_Occurred()) { /* the handler's way */
        one = PyObject_CallOneArg(consume_single, fields);
        if (one == Py_None) {
            Py_DECREF(one);
            Py_DECREF(fields);
            return 0;
        }
        if (one != NULL && (!PyTuple_Check(one) || PyTuple_GET_SIZE(one) != 2)) {
            PyErr_SetString(PyExc_TypeError, "consume_single must return (item, lastConsumedIndex) or None");
            Py_CLEAR(one);
        }
        if (one != NULL) {
            last = PyLong_AsLongLong(PyTuple_GET_ITEM(one, 1));
            PyObject *got = Py_NewRef(PyTuple_GET_ITEM(one, 0));
            Py_SETREF(one, got);
            if (last == -1 && PyErr_Occurred()) Py_CLEAR(one);
        }
    }
    Py_DECREF(fields);
    if (one == NULL) return -1;
    Py_buffer item;
    if (PyObject_GetBuffer(one, &item, PyBUF_SIMPLE) < 0) {
        Py_DECREF(one);
        return -1;
    }
    /* length | REPLY | "consume" | seqid | success { Result { 1: i32 0 } STOP, 2: list<binary> [1] | item length */
    unsigned char head[4 + 4 + 11 + 4 + 22 + 4], tail[13];
    put_i32(head, (uint32_t)(sizeof head - 4 + item.len + sizeof tail));
    memcpy(head + 4, "\x80\x01\x00\x02", 4);
    memcpy(head + 8, CONSUME_NAME, 11);
    put_i32(head + 19, (uint32_t)seqid);
    memcpy(head + 23, "\x0c\x00\x00\x0c\x00\x01\x08\x00\x01\x00\x00\x00\x00\x00\x0f\x00\x02\x0b\x00\x00\x00\x01", 22);
    put_i32(head + 45, (uint32_t)item.len);
    memcpy(tail, "\x0a\x00\x03", 3); /* 3: i64 lastConsumedIndex, STOP, STOP */
    put_i64(tail + 3, last);
    tail[11] = tail[12] = 0;
    struct iovec iov[3] = {{head, sizeof head}, {item.buf, (size_t)item.len}, {tail, sizeof tail}};
    int rc = send_all(fd, iov, 3);
    int err = errno;
    int small = item.len < POLL_REPLY_MAX;
    PyBuffer_Release(&item);
    Py_DECREF(one);
    if (rc < 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return small ? 1 : 2;
no:
    Py_DECREF(fields);
    return 0;
}


/* Poll fd without sleeping for up to poll_ns, or until another thread notes input:
 * bytes received into b (0: closed), -1 none came, -2 an error (errno). */
static ssize_t busy_poll(int fd, unsigned char *b, size_t len, unsigned long me, long long poll_ns) {
    ssize_t k;
    Py_BEGIN_ALLOW_THREADS
    long long deadline = mono_ns() + poll_ns;
    for (;;) {
        k = recv(fd, b, len, MSG_DONTWAIT);
        if (k >= 0) break;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            k = -2;
            break;
        }
        if (__atomic_load_n(&g_ident, __ATOMIC_RELAXED) != me || mono_ns() > deadline) {
            k = -1;
            break;
        }
    }
    Py_END_ALLOW_THREADS
    return k;
}

static PyObject *serve(PyObject *self, PyObject *args) {
    (void)self;
    int fd;
    unsigned long me;
    long poll_us;
    PyObject *bufobj, *hold, *idle, *note, *metrics, *produce_item, *produce_reply, *consume_single, *here;
    if (!PyArg_ParseTuple(args, "iOklOOOOOOOO:serve", &fd, &bufobj, &me, &poll_us, &hold, &idle, &note, &metrics,
                          &produce_item, &produce_reply, &consume_single, &here))
        return NULL;
    if (here != Py_None && (!PyTuple_Check(here) || PyTuple_GET_SIZE(here) != CTX_SIZE)) {
        PyErr_SetString(PyExc_TypeError, "serve: the in-place context must be None or QueueHandler.in_place_calls()");
        return NULL;
    }
    Py_buffer buf;
    if (PyObject_GetBuffer(bufobj, &buf, PyBUF_WRITABLE) < 0) return NULL;
    unsigned char *b = buf.buf;
    Py_ssize_t got = -1;
    long long poll_ns = (long long)poll_us * 1000, polled_since = 0;
    int answered = 0;
    for (;;) {
        ssize_t n = -1;
        if (poll_ns > 0 && answered && g_ident == me) {
            long long now = mono_ns();
            if (now - g_since > QUIET_NS) {
                if (!polled_since) polled_since = now;
                if (now - polled_since < RUN_NS) {
                    if (call0(hold) < 0) break;
                    n = busy_poll(fd, b, (size_t)buf.len, me, poll_ns);
                    if (n == -2) {
                        PyErr_SetFromErrno(PyExc_OSError);
                        break;
                    }
                    if (add_to(metrics, s_busy_polls, 1) < 0 || add_to(metrics, s_busy_poll_hits, n >= 0) < 0) break;
                    if (n < 0 && call0(idle) < 0) break;
                }
            }
        }
        if (n < 0) {
            polled_since = 0;
            struct pollfd pfd = {fd, POLLIN, 0};
            int prc;
            Py_BEGIN_ALLOW_THREADS
            do {
                prc = poll(&pfd, 1, -1);
            } while (prc < 0 && errno == EINTR);
            Py_END_ALLOW_THREADS
            if (prc < 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                break;
            }
            if (call0(hold) < 0) break;
            /* poll said the bytes are there: take them with the interpreter held (one
             * hand-over of it per call, not two). */
            do {
                n = recv(fd, b, (size_t)buf.len, MSG_DONTWAIT);
            } while (n < 0 && errno == EINTR);
            if (n < 0) {
                if (errno == EAGAIN || errno == EWOULDBLOCK) { /* woken for nothing: wait again */
                    if (call0(idle) < 0) break;
                    continue;
                }
                PyErr_SetFromErrno(PyExc_OSError);
                break;
            }
        }
        answered = 0;
        /* RECEIVING.note(me) changes something only when another thread received last
         * (g_ident mirrors RECEIVING.ident: note() writes both). */
        if (g_ident != me && call0(note) < 0) break;
        if (n < 8 || get_i32(b) != n - 4) { /* closed, or not exactly one frame */
            got = n;
            break;
        }
        int handled = b[11] == 7 && b[12] == 'p'   ? serve_produce(fd, b + 4, n - 4, produce_item, produce_reply, here, metrics)
                      : b[11] == 7 && b[12] == 'c' ? serve_consume(fd, b + 4, n - 4, consume_single, here, metrics)
                                                   : 0;
        if (handled < 0) break;
        if (handled == 0) {
            got = n;
            break;
        }
        answered = handled == 1; /* a small reply: its client calls again soon */
        if (add_to(metrics, s_calls, 1) < 0 || call0(idle) < 0) break;
    }
    PyBuffer_Release(&buf);
    if (got < 0) return NULL;
    return PyLong_FromSsize_t(got);
}

/* ---- The shared loop ------------------------------------------------------------------
 *
 * Loop(poll_us, metrics, here, follow=False): one thread (run()) waits in epoll for the
 * connections parked in it and serves their calls in place (append_here, consume_here),
 * so a call costs no wake-up of a connection's own thread and no hand-over of the
 * interpreter between connection threads: with several busy clients, those were a third of
 * the broker's CPU per call (futex waits and wakes of the interpreter's lock, 2026-11-28).
 *
 * park(fd, buf, me, conn, receiving) -> int | None, from a connection thread that holds
 * no input: its socket joins the loop and the thread sleeps until the loop hands the
 * connection back: with bytes in buf that the loop leaves to the Python loop (any call
 * not served in place, several frames, part of one: the count is returned, as serve()
 * returns it), 0 when the peer closed (or the loop stopped), an exception on a failed recv
 * or send. None: the loop is not running (the caller serves the connection itself).
 * ConnInput's rules as in serve(): conn.hold() before each recv, conn.idle() after each call
 * served, receiving.note(me) (RECEIVING follows the connection's thread, for which the loop
 * receives); done by their C twins (conn_hold, conn_idle, receiving_note): keep them in step
 * with luxun.net.
 *
 * Busy polling: after a small reply to a connection that has been the only one receiving
 * for 50 ms (serve()'s rules), run() polls epoll without sleeping, the interpreter
 * released, for up to poll_us, in runs of at most 2 ms.
 *
 * Following the client's CPU (``follow``, before busy polling): after a small reply to such a
 * lone connection, run() moves to the CPU its client's bytes came in on (SO_INCOMING_CPU:
 * over loopback, the CPU the client sent from) and sleeps in epoll instead of polling. A
 * client calling in a loop and this thread then take turns on one CPU, each woken by the
 * other on it, where a wake-up across CPUs (an idle vCPU of a VM halts) cost each call
 * more than the rest of it (2026-11-29, one thriftpy2 client, 100 B sync produce: 29.6-30.3
 * k calls/s at 31.8-32.6 us of broker CPU a call polling, 51.5-57.7 k at 6.3-7.2 us
 * following). Only among the CPUs this thread could run on when run() began, and only
 * while there are two or more: else it polls as before. Any other case (another connection
 * receiving, a big reply, several calls at once) puts it back on all of them. Each move is
 * counted in ``metrics.cpu_follows``.
 *
 * stop(): run() hands every parked connection back (0) and returns.
 */
/* ConnInput.hold()'s twin (luxun.net): about to take bytes from the kernel. */
static int conn_hold(PyObject *conn) {
    long long phase;
    if (get_ll(conn, s_phase, &phase) < 0) return -1;
    if (phase & 1) return 0;
    PyObject *busy = NULL, *ident = NULL;
    int rc = -1;
    if (set_ll(conn, s_phase, phase + 1) == 0 && (busy = PyObject_GetAttr(conn, s_busy)) != NULL &&
        (ident = PyObject_GetAttr(conn, s_ident)) != NULL)
        rc = PyDict_SetItem(busy, ident, conn);
    Py_XDECREF(busy);
    Py_XDECREF(ident);
    return rc;
}

/* ConnInput.idle()'s twin: every call taken from the kernel is handled. */
static int conn_idle(PyObject *conn) {
    long long phase;
    if (get_ll(conn, s_phase, &phase) < 0) return -1;
    if (!(phase & 1)) return 0;
    PyObject *busy = PyObject_GetAttr(conn, s_busy), *ident = busy == NULL ? NULL : PyObject_GetAttr(conn, s_ident);
    int rc = ident == NULL ? -1 : PyDict_DelItem(busy, ident);
    if (rc < 0 && ident != NULL && PyErr_ExceptionMatches(PyExc_KeyError)) { /* busy.pop(ident, None) */
        PyErr_Clear();
        rc = 0;
    }
    Py_XDECREF(busy);
    Py_XDECREF(ident);
    return rc < 0 ? -1 : set_ll(conn, s_phase, phase + 1);
}

/* _Receiving.note(me)'s twin (luxun.net's RECEIVING, and its mirror here, as note() keeps it). */
static int receiving_note(PyObject *receiving, unsigned long me) {
    if (g_ident == me) return 0;
    long long now = mono_ns();
    PyObject *ident = PyLong_FromUnsignedLong(me), *since = PyFloat_FromDouble((double)now / 1e9);
    int rc = ident == NULL || since == NULL || PyObject_SetAttr(receiving, s_ident, ident) < 0 ||
                     PyObject_SetAttr(receiving, s_since, since) < 0
                 ? -1
                 : 0;
    Py_XDECREF(ident);
    Py_XDECREF(since);
    if (rc == 0) {
        g_since = now;
        __atomic_store_n(&g_ident, me, __ATOMIC_RELAXED);
    }
    return rc;
}

typedef struct Parked {
    int fd;
    unsigned char *buf;
    size_t len;
    unsigned long me;
    PyObject *conn, *receiving; /* its ConnInput, and RECEIVING: the parked thread keeps them alive */
    sem_t done;
    Py_ssize_t got;                   /* handed back: bytes in buf (0: closed), -1 an exception */
    PyObject *exc_type, *exc_value, *exc_tb;
    struct Parked *prev, *next;       /* the loop's list of parked connections (GIL) */
} Parked;

typedef struct {
    PyObject_HEAD
    int ep, wake;
    long long poll_ns;
    PyObject *metrics, *here;
    Parked *parked;
    int running, stopping;
    int follow, pinned; /* follow the lone client's CPU; the one CPU run() is on, or -1 (all) */
    cpu_set_t allowed;  /* run()'s CPUs when it began */
} LoopObject;

/* Put run() on the CPU the bytes of the lone connection fd came in on: 1 there (a move
 * counted in metrics.cpu_follows), 0 not (unknown, not one of run()'s, a failed call), -1
 * an exception. */
static int follow_client(LoopObject *lp, int fd) {
    int cpu = -1;
    socklen_t len = sizeof cpu;
    if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &len) < 0 || cpu < 0 || cpu >= CPU_SETSIZE ||
        !CPU_ISSET(cpu, &lp->allowed))
        return 0;
    if (lp->pinned == cpu) return 1;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof one, &one) < 0) return 0;
    lp->pinned = cpu;
    return add_to(lp->metrics, s_cpu_follows, 1) < 0 ? -1 : 1;
}

/* Back on all of run()'s CPUs. */
static void unpin(LoopObject *lp) {
    if (lp->pinned >= 0 && sched_setaffinity(0, sizeof lp->allowed, &lp->allowed) == 0) lp->pinned = -1;
}

static void unlink_parked(LoopObject *lp, Parked *c) {
    if (c->prev) c->prev->next = c->next; else lp->parked = c->next;
    if (c->next) c->next->prev = c->prev;
    c->prev = c->next = NULL;
}

/* Give c back to its thread with got (-1: the exception set now goes with it). */
static void hand_back(LoopObject *lp, Parked *c, Py_ssize_t got) {
    epoll_ctl(lp->ep, EPOLL_CTL_DEL, c->fd, NULL);
    unlink_parked(lp, c);
    c->got = got;
    if (got < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "luxun._netloop: the shared loop failed");
        PyErr_Fetch(&c->exc_type, &c->exc_value, &c->exc_tb);
    }
    sem_post(&c->done); /* c belongs to its thread from here on */
}

/* A parked connection is readable: serve what came, or hand it back. 1 a small reply was
 * sent (busy polling may follow), 0 otherwise. */
static int serve_ready(LoopObject *lp, Parked *c) {
    if (conn_hold(c->conn) < 0) {
        hand_back(lp, c, -1);
        return 0;
    }
    ssize_t n;
    do {
        n = recv(c->fd, c->buf, c->len, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) { /* woken for nothing */
            if (conn_idle(c->conn) < 0) hand_back(lp, c, -1);
            return 0;
        }
        PyErr_SetFromErrno(PyExc_OSError);
        hand_back(lp, c, -1);
        return 0;
    }
    if (receiving_note(c->receiving, c->me) < 0) {
        hand_back(lp, c, -1);
        return 0;
    }
    const unsigned char *b = c->buf;
    if (n < 8 || get_i32(b) != n - 4) { /* closed, or not exactly one frame */
        hand_back(lp, c, n);
        return 0;
    }
    int handled = b[11] == 7 && b[12] == 'p'   ? serve_produce(c->fd, b + 4, n - 4, NULL, NULL, lp->here, lp->metrics)
                  : b[11] == 7 && b[12] == 'c' ? serve_consume(c->fd, b + 4, n - 4, NULL, lp->here, lp->metrics)
                                               : 0;
    if (handled == 0) {
        hand_back(lp, c, n);
        return 0;
    }
    if (handled < 0 || add_to(lp->metrics, s_calls, 1) < 0 || conn_idle(c->conn) < 0) {
        hand_back(lp, c, -1);
        return 0;
    }
    return handled == 1;
}

static PyObject *loop_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
    long poll_us;
    PyObject *metrics, *here;
    int follow = 0;
    static char *kwlist[] = {"poll_us", "metrics", "here", "follow", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "lOO|p:Loop", kwlist, &poll_us, &metrics, &here, &follow))
        return NULL;
    if (!PyTuple_Check(here) || PyTuple_GET_SIZE(here) != CTX_SIZE) {
        PyErr_SetString(PyExc_TypeError, "Loop: here must be QueueHandler.in_place_calls()");
        return NULL;
    }
    LoopObject *lp = (LoopObject *)type->tp_alloc(type, 0);
    if (lp == NULL) return NULL;
    lp->ep = epoll_create1(EPOLL_CLOEXEC);
    lp->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (lp->ep < 0 || lp->wake < 0 || epoll_ctl(lp->ep, EPOLL_CTL_ADD, lp->wake, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(lp);
        return NULL;
    }
    lp->poll_ns = (long long)poll_us * 1000;
    lp->follow = follow;
    lp->pinned = -1;
    lp->metrics = Py_NewRef(metrics);
    lp->here = Py_NewRef(here);
    return (PyObject *)lp;
}

static void loop_dealloc(LoopObject *lp) {
    if (lp->ep >= 0) close(lp->ep);
    if (lp->wake >= 0) close(lp->wake);
    Py_XDECREF(lp->metrics);
    Py_XDECREF(lp->here);
    Py_TYPE(lp)->tp_free((PyObject *)lp);
}

static PyObject *loop_park(LoopObject *lp, PyObject *args) {
    int fd;
    unsigned long me;
    PyObject *bufobj, *conn, *receiving;
    if (!PyArg_ParseTuple(args, "iOkOO:park", &fd, &bufobj, &me, &conn, &receiving)) return NULL;
    if (!lp->running || lp->stopping) Py_RETURN_NONE;
    Py_buffer buf;
    if (PyObject_GetBuffer(bufobj, &buf, PyBUF_WRITABLE) < 0) return NULL;
    Parked c;
    memset(&c, 0, sizeof c);
    c.fd = fd;
    c.buf = buf.buf;
    c.len = (size_t)buf.len;
    c.me = me;
    c.conn = conn;
    c.receiving = receiving;
    sem_init(&c.done, 0, 0);
    c.next = lp->parked;
    if (c.next) c.next->prev = &c;
    lp->parked = &c;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &c};
    if (epoll_ctl(lp->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        unlink_parked(lp, &c);
        sem_destroy(&c.done);
        PyBuffer_Release(&buf);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    while (sem_wait(&c.done) < 0 && errno == EINTR) {
    }
    Py_END_ALLOW_THREADS
    sem_destroy(&c.done);
    PyBuffer_Release(&buf);
    if (c.got < 0) {
        PyErr_Restore(c.exc_type, c.exc_value, c.exc_tb);
        return NULL;
    }
    return PyLong_FromSsize_t(c.got);
}

static PyObject *loop_run(LoopObject *lp, PyObject *noargs) {
    (void)noargs;
    struct epoll_event evs[64];
    lp->running = 1;
    Parked *last = NULL; /* the connection served last, when it got a small reply */
    long long polled_since = 0;
    /* Following needs two CPUs or more to choose from (on one, client and loop share it anyway). */
    int follow = lp->follow && sched_getaffinity(0, sizeof lp->allowed, &lp->allowed) == 0 && CPU_COUNT(&lp->allowed) > 1;
    while (!lp->stopping) {
        int k = -1;
        /* The connection served last has been the only one receiving for QUIET_NS. */
        long long now = last != NULL && g_ident == last->me ? mono_ns() : 0;
        int lone = now && now - g_since > QUIET_NS;
        int followed = follow && lone ? follow_client(lp, last->fd) : 0;
        if (followed < 0) break;
        if (!followed) unpin(lp);
        if (!followed && lone && lp->poll_ns > 0) {
            if (!polled_since) polled_since = now;
            if (now - polled_since < RUN_NS) {
                unsigned long me = last->me;
                long long poll_ns = lp->poll_ns;
                Py_BEGIN_ALLOW_THREADS
                long long deadline = mono_ns() + poll_ns;
                do {
                    k = epoll_wait(lp->ep, evs, 64, 0);
                } while (k == 0 && __atomic_load_n(&g_ident, __ATOMIC_RELAXED) == me && mono_ns() < deadline);
                Py_END_ALLOW_THREADS
                if (k <= 0) k = -1;
                if (add_to(lp->metrics, s_busy_polls, 1) < 0 || add_to(lp->metrics, s_busy_poll_hits, k > 0) < 0)
                    break;
            }
        }
        if (k < 0) {
            polled_since = 0;
            Py_BEGIN_ALLOW_THREADS
            do {
                k = epoll_wait(lp->ep, evs, 64, -1);
            } while (k < 0 && errno == EINTR);
            Py_END_ALLOW_THREADS
            if (k < 0) {
                PyErr_SetFromErrno(PyExc_OSError);
                break;
            }
        }
        last = NULL;
        int answered = 0;
        for (int i = 0; i < k; i++) {
            Parked *c = evs[i].data.ptr;
            if (c == NULL) continue; /* stop() */
            int small = serve_ready(lp, c);
            if (small) last = c, answered++;
        }
        if (answered != 1) last = NULL; /* busy polling follows one lone connection's call */
        if (PyErr_Occurred()) break;
    }
    /* Stopped (or failed): every parked connection goes back to its thread. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    unpin(lp);
    lp->running = 0;
    while (lp->parked != NULL) hand_back(lp, lp->parked, 0);
    PyErr_Restore(type, value, tb);
    if (PyErr_Occurred()) return NULL;
    Py_RETURN_NONE;
}

static PyObject *loop_stop(LoopObject *lp, PyObject *noargs) {
    (void)noargs;
    lp->stopping = 1;
    uint64_t one = 1;
    if (write(lp->wake, &one, sizeof one) < 0 && errno != EAGAIN) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyMethodDef loop_methods[] = {
    {"park", (PyCFunction)loop_park, METH_VARARGS,
     "park(fd, buf, me, conn, receiving) -> bytes left in buf for the Python loop (0: closed), or None"},
    {"run", (PyCFunction)loop_run, METH_NOARGS, "run(): serve the parked connections until stop()"},
    {"stop", (PyCFunction)loop_stop, METH_NOARGS, "stop(): run() hands every connection back and returns"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LoopType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "luxun._netloop.Loop",
    .tp_basicsize = sizeof(LoopObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The shared loop: one thread serving parked connections' calls in place (see _netloop.c).",
    .tp_new = loop_new,
    .tp_dealloc = (destructor)loop_dealloc,
    .tp_methods = loop_methods,
};

static PyObject *note(PyObject *self, PyObject *arg) {
    (void)self;
    unsigned long ident = PyLong_AsUnsignedLong(arg);
    if (ident == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    if (g_ident != ident) {
        g_since = mono_ns();
        __atomic_store_n(&g_ident, ident, __ATOMIC_RELAXED);
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"serve", serve, METH_VARARGS,
     "serve(fd, buf, me, poll_us, hold, idle, note, metrics, produce_item, produce_reply, consume_single, here) -> "
     "bytes received and left in buf (0: closed)"},
    {"note", note, METH_O, "note(ident): the thread that received bytes last"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "luxun._netloop", "The compiled parts of a connection's loop (see _netloop.c).", -1, methods,
    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__netloop(void) {
    static const char *names[6] = {NULL, "topic", "fanoutId", "startIndex", "maxFetchSize", "maxWaitMs"};
    s_resultCode = PyUnicode_InternFromString("resultCode");
    s_errorCode = PyUnicode_InternFromString("errorCode");
    s_errorMessage = PyUnicode_InternFromString("errorMessage");
    s_busy_polls = PyUnicode_InternFromString("busy_polls");
    s_busy_poll_hits = PyUnicode_InternFromString("busy_poll_hits");
    s_calls = PyUnicode_InternFromString("compiled_loop_calls");
    s_in_place = PyUnicode_InternFromString("compiled_loop_in_place");
    s_cpu_follows = PyUnicode_InternFromString("cpu_follows");
    if (!s_in_place || !s_cpu_follows || !s_resultCode || !s_errorCode || !s_errorMessage || !s_busy_polls || !s_busy_poll_hits || !s_calls)
        return NULL;
    for (int i = 1; i < 6; i++)
        if ((k_fields[i] = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    static const char *attrs[] = {"flush_count", "max_message_size", "queue", "array", "used", "stats",
                                  "items_in", "bytes_in", "waiters", "watchers", "notify", "produce",
                                  "items_out", "bytes_out", "consume", "_lock", "_calls", "count",
                                  "sum_s", "buckets", "phase", "busy", "ident", "since"};
    PyObject **slots[] = {&s_flush_count, &s_max_message_size, &s_queue, &s_array, &s_used, &s_stats,
                          &s_items_in, &s_bytes_in, &s_waiters, &s_watchers, &s_notify, &s_produce,
                          &s_items_out, &s_bytes_out, &s_consume, &s__lock, &s__calls, &s_count,
                          &s_sum_s, &s_buckets, &s_phase, &s_busy, &s_ident, &s_since};
    for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++)
        if ((*slots[i] = PyUnicode_InternFromString(attrs[i])) == NULL) return NULL;
    /* PyCapsule_Import imports only "bigarray" itself: the submodule first. */
    PyObject *mod = PyImport_ImportModule("bigarray._fastpath");
    g_bigarray = mod == NULL ? NULL : PyCapsule_Import("bigarray._fastpath._C_API", 0);
    Py_XDECREF(mod);
    if (g_bigarray == NULL) PyErr_Clear(); /* not built: every produce goes to produce_item */
    if (PyType_Ready(&LoopType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&LoopType);
    if (PyModule_AddObject(m, "Loop", (PyObject *)&LoopType) < 0) {
        Py_DECREF(&LoopType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
