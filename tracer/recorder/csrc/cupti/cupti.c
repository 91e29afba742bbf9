/* The tracer.recorder._cupti module: CUPTI's activity API driven directly, with no Kineto
 * session to stop (tracer/recorder/device/cupti_direct.py says how the recorder uses it).
 *
 * CUPTI fills buffers this module hands it and gives each full one back on a thread of its
 * own (every flush period, or at a flush). The completion callback turns the records it keeps
 * (kernels, memcpys, memsets and the runtime and driver calls that launch them) into rows of
 * nine int64 columns, the order of tracer.files.device_format's, under a mutex and without the
 * GIL; the recorder's flusher drains them. Nothing here runs on the training thread but the
 * start, the stop and the final flush. No call here waits for the mutex, or calls CUPTI,
 * holding the GIL: CUPTI's thread holds the mutex while it parses a whole buffer.
 *
 * No CUPTI header is needed to build it: libcupti is the one torch's CUDA build already loaded
 * (dlopen of its path), and the records are read through the prefixes in cuptirecords.h.
 * NOTE: those prefixes are CUPTI's own layouts, unchanged since CUDA 10 in every later record
 * version (CUpti_ActivityKernel4 to 10, Memcpy to Memcpy6, Memset to Memset4, API); new fields
 * were only appended. tests/integration/test_cupti_layout.py compiles against the headers of
 * every CUPTI it finds (the nvidia-cuda-cupti wheels, triton's copy) and compares offsets; only
 * the versions compared so (TESTED_VERSIONS) start. tests/integration/test_cupti_standin.py
 * runs every path here against a stand-in libcupti (tests/support/cupti_standin.c).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuptirecords.h"

static const uint32_t KINDS_ON[] = {K_CONCURRENT_KERNEL, K_MEMCPY, K_MEMSET};
#define N_KINDS_ON 3
static const uint32_t TESTED[] = TESTED_VERSIONS;
#define N_TESTED (sizeof TESTED / sizeof *TESTED)
#define MAX_CALLS 512

static uint32_t loaded_version;     /* cuptiGetVersion's, of the library load() opened */
static int own_clock = 0;           /* unix_ns is CUPTI's clock (set by the latest start) */
static struct {                     /* what the latest start turned on, for stop to turn off */
    int kinds;                      /* KINDS_ON[0 .. kinds) */
    int whole[2];                   /* the driver [0] and runtime [1] kinds, every call */
    uint32_t calls[2][MAX_CALLS];   /* or the driver and runtime calls kept, one by one */
    size_t n_calls[2];
    int period;                     /* a flush period */
} on;

/* The test-only calls (cuptitests.c) */
PyObject *cupti_take_record(PyObject *self, PyObject *arg);
PyObject *cupti_layout(PyObject *self, PyObject *unused);
PyObject *cupti_counters(PyObject *self, PyObject *unused);
PyObject *cupti_fail_allocations(PyObject *self, PyObject *arg);

static PyObject *
error_of(const CuptiCalls *calls, const char *call, int result)
{
    const char *text = NULL;
    if (calls->result_string == NULL || calls->result_string(result, &text) != CUPTI_OK)
        text = NULL;
    return PyErr_Format(PyExc_RuntimeError, "%s: %s (%d)", call, text ? text : "CUPTI error",
                        result);
}

static PyObject *
cupti_error(const char *call, int result)
{
    return error_of(&cupti, call, result);
}

static PyObject *
cupti_load(PyObject *self, PyObject *arg)
{
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return PyErr_Format(PyExc_OSError, "%s", dlerror());
    CuptiCalls calls;                  /* the module's, once every required one is found */
#define SYM(field, name, required) \
    do { *(void **)&calls.field = dlsym(lib, name); \
         if (required && calls.field == NULL) \
             return PyErr_Format(PyExc_OSError, "%s: no %s", path, name); } while (0)
    SYM(get_version, "cuptiGetVersion", 1);
    SYM(enable, "cuptiActivityEnable", 1);
    SYM(disable, "cuptiActivityDisable", 1);
    SYM(register_callbacks, "cuptiActivityRegisterCallbacks", 1);
    SYM(next_record, "cuptiActivityGetNextRecord", 1);
    SYM(dropped, "cuptiActivityGetNumDroppedRecords", 1);
    SYM(flush_all, "cuptiActivityFlushAll", 1);
    SYM(timestamp, "cuptiGetTimestamp", 1);
    SYM(flush_period, "cuptiActivityFlushPeriod", 0);
    SYM(register_timestamp, "cuptiActivityRegisterTimestampCallback", 0);
    SYM(callback_name, "cuptiGetCallbackName", 0);
    SYM(result_string, "cuptiGetResultString", 0);
    SYM(enable_driver_api, "cuptiActivityEnableDriverApi", 0);
    SYM(enable_runtime_api, "cuptiActivityEnableRuntimeApi", 0);
#undef SYM
    uint32_t version = 0;
    int r = calls.get_version(&version);
    if (r != CUPTI_OK)
        return error_of(&calls, "cuptiGetVersion", r);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&cupti_lock);      /* CUPTI's thread may be reading the calls */
    cupti = calls;
    loaded_version = version;
    forget_calls();
    pthread_mutex_unlock(&cupti_lock);
    Py_END_ALLOW_THREADS
    return PyLong_FromUnsignedLong(version);
}

/* CUPTI's clock while this module records: CLOCK_REALTIME, so that records are Unix ns.
 * Kineto registers a clock of its own at each profiler start (the TSC's ticks, which its export
 * converts): a torch.profiler run earlier in the process leaves records in ticks, not ns
 * (seen on an H200, torch 2.11: kernels seconds off their launches). So every start sets it.
 * NOTE: stop cannot take it back (CUPTI refuses a NULL clock); it is CUPTI's own default on
 * Linux, and stays valid: an extension module is never unloaded. */
static uint64_t
unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int (*call_switch(int d))(uint32_t, uint8_t)
{
    return d == 0 ? cupti.enable_driver_api : cupti.enable_runtime_api;
}

/* The driver (d 0) or runtime (d 1) calls' records: only the kept calls' (launches, copies,
 * sets), one by one, where CUPTI can (12.x on: Kineto turns cudaGetDevice, cuCtxGetCurrent...
 * off at the source too); else every call's, which take() then leaves out. */
static int
enable_calls(int d)
{
    int (*one)(uint32_t, uint8_t) = call_switch(d);
    if (one != NULL) {
        pthread_mutex_lock(&cupti_lock);          /* the names interned on the way */
        size_t n = kept_calls(d == 0 ? DOMAIN_DRIVER : DOMAIN_RUNTIME, on.calls[d], MAX_CALLS);
        pthread_mutex_unlock(&cupti_lock);
        size_t i = 0;
        while (i < n && one(on.calls[d][i], 1) == CUPTI_OK)
            i++;
        if (n > 0 && i == n) {
            on.n_calls[d] = n;
            return CUPTI_OK;
        }
        while (i > 0)
            one(on.calls[d][--i], 0);
    }
    int r = cupti.enable(d == 0 ? K_DRIVER : K_RUNTIME);
    on.whole[d] = r == CUPTI_OK;
    return r;
}

/* Everything the latest start turned on, off (GIL released). */
static void
turn_off(void)
{
    for (int d = 0; d < 2; d++) {
        for (size_t i = 0; i < on.n_calls[d]; i++)
            call_switch(d)(on.calls[d][i], 0);
        if (on.whole[d])
            cupti.disable(d == 0 ? K_DRIVER : K_RUNTIME);
        on.n_calls[d] = 0;
        on.whole[d] = 0;
    }
    for (int i = 0; i < on.kinds; i++)
        cupti.disable(KINDS_ON[i]);
    on.kinds = 0;
    if (on.period && cupti.flush_period != NULL)
        cupti.flush_period(0);               /* CUPTI's own heuristics again */
    on.period = 0;
}

static int
tested(uint32_t version)
{
    for (size_t i = 0; i < N_TESTED; i++)
        if (TESTED[i] == version)
            return 1;
    return 0;
}

static PyObject *
cupti_start(PyObject *self, PyObject *args)
{
    Py_ssize_t bytes;
    unsigned int period_ms;
    if (!PyArg_ParseTuple(args, "nI", &bytes, &period_ms))
        return NULL;
    if (cupti.enable == NULL)
        return PyErr_Format(PyExc_RuntimeError, "libcupti is not loaded");
    if (!tested(loaded_version))
        return PyErr_Format(PyExc_RuntimeError, "CUPTI %u: its record layouts are not tested",
                            loaded_version);
    set_buffer_bytes(bytes > 0 ? (size_t)bytes : 0);
    const char *failed = NULL;
    int r = CUPTI_OK;
    Py_BEGIN_ALLOW_THREADS
    memset(&on, 0, sizeof on);
    /* before any kind is enabled, as CUPTI asks; where it cannot be set, each drain pairs
     * CUPTI's own clock with CLOCK_REALTIME instead (clock() below) */
    own_clock = cupti.register_timestamp != NULL &&
        cupti.register_timestamp(unix_ns) == CUPTI_OK;
    if ((r = cupti.register_callbacks(buffer_requested, buffer_completed)) != CUPTI_OK)
        failed = "cuptiActivityRegisterCallbacks";
    while (failed == NULL && on.kinds < N_KINDS_ON)
        if ((r = cupti.enable(KINDS_ON[on.kinds])) == CUPTI_OK)
            on.kinds++;
        else
            failed = "cuptiActivityEnable";
    for (int d = 0; d < 2 && failed == NULL; d++)
        if ((r = enable_calls(d)) != CUPTI_OK)
            failed = "cuptiActivityEnable";
    if (failed != NULL)
        turn_off();
    else if (cupti.flush_period != NULL && period_ms)
        on.period = cupti.flush_period(period_ms) == CUPTI_OK;  /* CUPTI's thread hands back */
    Py_END_ALLOW_THREADS
    if (failed != NULL)
        return cupti_error(failed, r);
    Py_RETURN_NONE;
}

static PyObject *
cupti_stop(PyObject *self, PyObject *unused)
{
    if (cupti.disable != NULL) {
        Py_BEGIN_ALLOW_THREADS
        turn_off();
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *
cupti_flush(PyObject *self, PyObject *forced)
{
    if (cupti.flush_all == NULL)
        Py_RETURN_NONE;
    int r, force = PyObject_IsTrue(forced);
    if (force < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS        /* the completion callback runs meanwhile, without the GIL */
    r = cupti.flush_all(force ? FLUSH_FORCED : 0);
    Py_END_ALLOW_THREADS
    if (r != CUPTI_OK)
        return cupti_error("cuptiActivityFlushAll", r);
    Py_RETURN_NONE;
}

/* The drain's result from what it took, or NULL (an error set). */
static PyObject *
drained(const Taken *t, const char **fresh, size_t n_fresh)
{
    PyObject *names = PyList_New((Py_ssize_t)n_fresh), *data = NULL;
    for (size_t i = 0; names != NULL && i < n_fresh; i++) {
        PyObject *text = PyUnicode_DecodeUTF8(fresh[i], (Py_ssize_t)strlen(fresh[i]),
                                              "replace");
        if (text == NULL)
            Py_CLEAR(names);
        else
            PyList_SET_ITEM(names, (Py_ssize_t)i, text);
    }
    if (names != NULL)
        data = PyBytes_FromStringAndSize((const char *)t->rows, (Py_ssize_t)(t->n * sizeof(Row)));
    if (data == NULL) {
        Py_XDECREF(names);
        return NULL;
    }
    return Py_BuildValue("(NNLLL)", data, names, (long long)t->lost, (long long)t->dropped,
                         (long long)t->foreign);
}

/* drain(known): (rows as bytes, the names interned from index `known` on, rows lost, records
 * CUPTI dropped, buffers not this module's), since the last drain. The caller counts the names
 * it holds: a drain that fails (no memory) gives its rows back, and the next one returns the
 * same names again. */
static PyObject *
cupti_drain(PyObject *self, PyObject *arg)
{
    Py_ssize_t known = PyLong_AsSsize_t(arg);
    if (known < 0)
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "drain: known < 0");
    Taken t = {0};
    const char **fresh = NULL;
    size_t n_fresh = 0, last = 0;
    int too_many = 0, no_memory = 0;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&cupti_lock);   /* CUPTI's thread may grow the names meanwhile */
    last = names_interned();
    too_many = (size_t)known > last;
    n_fresh = too_many ? 0 : last - (size_t)known;
    if (n_fresh > 0 && (fresh = records_alloc(n_fresh * sizeof *fresh)) == NULL)
        no_memory = 1;
    for (size_t i = 0; fresh != NULL && i < n_fresh; i++)
        fresh[i] = name_at((size_t)known + i);    /* a name, once interned, never moves */
    if (!too_many && !no_memory)
        take_all(&t);
    pthread_mutex_unlock(&cupti_lock);
    Py_END_ALLOW_THREADS
    if (too_many)
        return PyErr_Format(PyExc_ValueError, "drain: %zd names known, %zu interned", known,
                            last);
    if (no_memory)
        return PyErr_NoMemory();
    PyObject *out = drained(&t, fresh, n_fresh);     /* Python's objects, after the unlock */
    free(fresh);
    if (out != NULL) {
        free(t.rows);
        return out;
    }
    Py_BEGIN_ALLOW_THREADS             /* the error stays set meanwhile */
    pthread_mutex_lock(&cupti_lock);
    give_back(&t);
    pthread_mutex_unlock(&cupti_lock);
    Py_END_ALLOW_THREADS
    return NULL;
}

/* (CUPTI's clock, CLOCK_REALTIME) read together, in ns: one reading twice where CUPTI's clock
 * is this module's own (see unix_ns) */
static PyObject *
cupti_clock(PyObject *self, PyObject *unused)
{
    uint64_t t = 0;
    if (cupti.timestamp == NULL)
        return PyErr_Format(PyExc_RuntimeError, "libcupti is not loaded");
    if (own_clock) {
        t = unix_ns();
        return Py_BuildValue("(KK)", (unsigned long long)t, (unsigned long long)t);
    }
    int r = cupti.timestamp(&t);
    uint64_t unix_t = unix_ns();
    if (r != CUPTI_OK)
        return cupti_error("cuptiGetTimestamp", r);
    return Py_BuildValue("(KK)", (unsigned long long)t, (unsigned long long)unix_t);
}

/* whether CUPTI's clock is this module's CLOCK_REALTIME (False before the first start, or
 * where CUPTI has no cuptiActivityRegisterTimestampCallback) */
static PyObject *
cupti_own_clock(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(own_clock);
}

static PyMethodDef cupti_functions[] = {
    {"load", cupti_load, METH_O, "load(path): libcupti's calls; returns cuptiGetVersion's."},
    {"start", cupti_start, METH_VARARGS,
     "start(buffer_bytes, flush_period_ms): register the buffers, enable the kinds."},
    {"stop", cupti_stop, METH_NOARGS,
     "Turn off what start turned on (records under way still come)."},
    {"flush", cupti_flush, METH_O, "flush(forced): cuptiActivityFlushAll, without the GIL."},
    {"drain", cupti_drain, METH_O,
     "drain(known): (rows bytes, names from index known on, rows lost, records CUPTI dropped, "
     "buffers not this module's) since the last drain."},
    {"clock", cupti_clock, METH_NOARGS, "(cuptiGetTimestamp, CLOCK_REALTIME) in ns."},
    {"own_clock", cupti_own_clock, METH_NOARGS, "Whether CUPTI's clock is CLOCK_REALTIME."},
    {"take_record", cupti_take_record, METH_O, "Tests: one record through the parse."},
    {"layout", cupti_layout, METH_NOARGS, "Tests: the record offsets and constants read."},
    {"counters", cupti_counters, METH_NOARGS,
     "Tests: buffers out with CUPTI, names demangled, calls enabled one by one."},
    {"fail_allocations", cupti_fail_allocations, METH_O,
     "Tests: fail_allocations(n): the records half's allocations past the next n fail."},
    {NULL},
};

static struct PyModuleDef cupti_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracer.recorder._cupti",
    .m_doc = "CUPTI's activity API without Kineto (tracer/recorder/device/cupti_direct.py).",
    .m_size = -1,
    .m_methods = cupti_functions,
};

/* Tests: the calls start enabled one by one, per domain (cuptitests.c's counters). */
size_t
calls_enabled(int d)
{
    return on.n_calls[d];
}

PyMODINIT_FUNC
PyInit__cupti(void)
{
    PyObject *module = PyModule_Create(&cupti_module), *versions = PyTuple_New(N_TESTED);
    for (size_t i = 0; versions != NULL && i < N_TESTED; i++) {
        PyObject *v = PyLong_FromUnsignedLong(TESTED[i]);
        if (v == NULL)
            Py_CLEAR(versions);
        else
            PyTuple_SET_ITEM(versions, (Py_ssize_t)i, v);
    }
    if (module == NULL || versions == NULL ||
        PyModule_AddObjectRef(module, "TESTED_VERSIONS", versions) < 0 ||
        PyModule_AddIntConstant(module, "ROW_BYTES", sizeof(Row)) < 0) {
        Py_XDECREF(versions);
        Py_XDECREF(module);
        return NULL;
    }
    Py_DECREF(versions);
    return module;
}
