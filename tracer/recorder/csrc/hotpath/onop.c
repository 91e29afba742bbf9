/* Session.on_op's common path in C; tracer/recorder/op_path.py's on_op is its twin, and does
 * everything this path leaves to it (sessiontypes.c: the types that run it).
 *
 * SessionState is the base of tracer.recorder.session.Session. The fields the hot path reads on
 * every op are its members, so the Python side reads and sets them under the same names
 * (session.recompute += 1) and C reads them without a dictionary lookup.
 *
 * OpDispatch is what torch calls as the recording mode's __torch_dispatch__ (an instance
 * attribute; torch only asks that its __self__ be the mode). It records an op on plain tensors
 * that is neither a collective nor special, with no GPU window to open and no functional
 * collective pending, step for step as on_op does, the storages it made and the tensors a
 * backward node saved included when memory is recorded (storagetable.c).
 * Everything else (tensor subclasses, an op not
 * classified yet, collectives, a dispatch with no Python frame to attribute it to) goes to the
 * mode's Python __torch_dispatch__, which hands it to on_op. The choice is made before the op
 * runs, so an op runs once, on one path; tests/integration/test_hotpath.py holds the two to the same rows.
 * A failure of the recorder's own work (an exception from a callback: a new stack node, a
 * storage's first sight...) puts the session into passthrough (tracer/recorder/passthrough.py)
 * and never reaches the user's step: the op's result stands.
 */
#include "hotpath.h"

long long
now_ns(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t = 0;
    (void)PyTime_PerfCounterRaw(&t);   /* cannot fail once the interpreter runs */
    return (long long)t;
#else
    return (long long)_PyTime_GetPerfCounter();   /* time.perf_counter_ns's clock */
#endif
}

/* ------------------------------------------------------------------ reading the Python side */
static int
as_ll(PyObject *value, long long *out)
{
    if (value == NULL)
        return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

static int
call_ll(PyObject *fn, long long *out)
{
    return as_ll(PyObject_CallNoArgs(fn), out);
}

static int
attr_ll(PyObject *obj, PyObject *name, long long *out)
{
    return as_ll(PyObject_GetAttr(obj, name), out);
}

/* The cached entry of an op overload (borrowed), or NULL: not classified yet (no error set), or
   an error (set). */
static PyObject *
entry_of(SessionState *s, PyObject *func)
{
    Slot *slot = map_find(&s->entries, func, 0);
    if (slot != NULL)
        return (PyObject *)slot->value;
    if (s->specs == NULL || !PyDict_Check(s->specs))
        return NULL;
    PyObject *key = PyLong_FromVoidPtr(func);
    if (key == NULL)
        return NULL;
    PyObject *entry = PyDict_GetItemWithError(s->specs, key);
    Py_DECREF(key);
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 5 ||
        PyTuple_GET_ITEM(entry, 4) != func)
        return NULL;
    /* the entry holds the overload: its address cannot be reused while the map holds both */
    return map_add(&s->entries, func, 0, entry, entry) < 0 ? NULL : entry;
}

/* memory is recorded (memory_recorder.py set the table; session_is_ready checks its type) */
static int
memory_on(SessionState *s)
{
    return s->memory_table != NULL && s->memory_table != Py_None;
}

int
session_is_ready(SessionState *s)
{
    return s->queue && s->push && s->threads && PyDict_Check(s->threads) && s->fwd_of_node &&
        PyDict_Check(s->fwd_of_node) && s->fwd_prev && PyDict_Check(s->fwd_prev) && s->funcol &&
        s->futures && PyDict_Check(s->futures) &&
        s->modules && s->annotations && s->rules && s->stacks && s->signatures &&
        PyObject_TypeCheck(s->stacks, &StackWalkType) &&
        PyObject_TypeCheck(s->signatures, &ShapeKeysType) &&
        s->torch_state && PyTuple_Check(s->torch_state) && PyTuple_GET_SIZE(s->torch_state) == 4 &&
        (!memory_on(s) || Py_IS_TYPE(s->memory_table, &StorageTableType));
}

static int
set_ll(PyObject *dict, long long key, long long value)
{
    PyObject *k = PyLong_FromLongLong(key), *v = PyLong_FromLongLong(value);
    int failed = (k == NULL || v == NULL) ? -1 : PyDict_SetItem(dict, k, v);
    Py_XDECREF(k);
    Py_XDECREF(v);
    return failed;
}

/* ------------------------------------------------------------------ the steps of on_op */
static int
capture(SessionState *s, PyFrameObject *frame, long long *out)
{
    if (!s->record_stacks) {
        *out = -1;
        return 0;
    }
    return as_ll(walk_capture((StackWalk *)s->stacks, (PyObject *)frame), out);
}

static int
shape_id(SessionState *s, PyObject *args, long long *out)
{
    if (!s->record_shapes) {
        *out = -1;
        return 0;
    }
    return as_ll(shape_keys_id_of(s->signatures, args), out);
}

/* on_op's forward branch: the origin of the autograd nodes made since the last op (*made:
   whether there are any: autograd recorded the op) */
static int
remember_nodes(SessionState *s, PyFrameObject *frame, long long stack, long long module,
               int grad_enabled, int *made)
{
    long long seq, fwd = stack;
    if (call_ll(PyTuple_GET_ITEM(s->torch_state, 3), &seq) < 0)
        return -1;
    *made = seq != s->last_seq;
    if (!*made)
        return 0;
    if (!grad_enabled) {     /* in a Function's forward (phases.py) */
        PyObject *at = PyLong_FromLongLong(stack);
        if (at == NULL)
            return -1;
        PyObject *found = PyObject_CallMethodObjArgs(s->rules, str_applied_at, (PyObject *)frame,
                                                     at, NULL);
        Py_DECREF(at);
        if (as_ll(found, &fwd) < 0)
            return -1;
    }
    long long origin = (long long)((unsigned long long)(fwd + 1) << 32) | (module + 1);
    long long count = seq - s->last_seq;
    if (1 < count && count <= 8) {
        for (long long n = s->last_seq; n < seq; n++)
            if (set_ll(s->fwd_of_node, n, origin) < 0)
                return -1;
    }
    else if (set_ll(s->fwd_of_node, seq - 1, origin) < 0)
        return -1;
    s->last_seq = seq;
    if (PyDict_GET_SIZE(s->fwd_of_node) > MAX_NODES) {   /* a run that never steps */
        PyObject *fresh = PyDict_New();
        if (fresh == NULL)
            return -1;
        Py_SETREF(s->fwd_prev, s->fwd_of_node);
        s->fwd_of_node = fresh;
    }
    return 0;
}

/* on_op's backward branch: the forward stack and module of the node running (*seq: its
   sequence number; AccumulateGrad's is UINT64_MAX) */
static int
node_origin(SessionState *s, PyObject *node, long long *fwd_stack, long long *module,
            unsigned long long *seq)
{
    PyObject *nseq = PyObject_CallMethodNoArgs(node, str_sequence_nr);
    if (nseq == NULL)
        return -1;
    *seq = PyLong_AsUnsignedLongLong(nseq);
    if (*seq == (unsigned long long)-1 && PyErr_Occurred()) {
        Py_DECREF(nseq);
        return -1;
    }
    PyObject *origin = PyDict_GetItemWithError(s->fwd_of_node, nseq);
    if (origin == NULL && !PyErr_Occurred())
        origin = PyDict_GetItemWithError(s->fwd_prev, nseq);
    Py_DECREF(nseq);
    long long value = 0;
    if (origin != NULL) {
        value = PyLong_AsLongLong(origin);
        if (value == -1 && PyErr_Occurred())
            return -1;
    }
    else if (PyErr_Occurred())
        return -1;
    *fwd_stack = (value >> 32) - 1;
    *module = (value & 0xFFFFFFFFLL) - 1;
    return 0;
}

static int
thread_number(SessionState *s, long long *out)
{
    PyObject *ident = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (ident == NULL)
        return -1;
    PyObject *number = PyDict_GetItemWithError(s->threads, ident);
    Py_DECREF(ident);
    if (number != NULL) {
        Py_INCREF(number);
        return as_ll(number, out);
    }
    if (PyErr_Occurred())
        return -1;
    return as_ll(PyObject_CallMethodNoArgs((PyObject *)s, str_thread), out);
}

static int
queue_row(SessionState *s, const long long *values)
{
    PyObject *row = PyBytes_FromStringAndSize(NULL, ROW_FIELDS * 8);
    if (row == NULL)
        return -1;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(row);
    for (int i = 0; i < ROW_FIELDS; i++) {
        uint64_t v = (uint64_t)values[i];
        for (int b = 0; b < 8; b++)
            *p++ = (unsigned char)(v >> (8 * b));
    }
    PyObject *done = PyObject_CallOneArg(s->push, row);
    Py_DECREF(row);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* Everything on_op does after the op ran, for a plain op (no comm, no special). */
static int
record(SessionState *s, PyObject *entry, PyObject *args, PyObject *out, PyFrameObject *frame,
       long long t0, long long t1)
{
    PyObject *ts = s->torch_state, *hint_obj = NULL;
    long long v[ROW_FIELDS], hint = -1, module, stack, fwd_stack = -1, enabled, phase;
    unsigned long long nseq;
    long long thread, shapes, annotation;
    int failed = -1, has_hint, made = 0;
    PyObject *node = PyObject_CallNoArgs(PyTuple_GET_ITEM(ts, 0));
    if (node == NULL)
        return -1;
    hint_obj = PyObject_GetAttr(s->annotations, str_phase_hint);
    if (hint_obj == NULL || (hint_obj != Py_None && (hint = PyLong_AsLongLong(hint_obj)) == -1 &&
                             PyErr_Occurred()))
        goto done;
    has_hint = hint_obj != Py_None;
    if (node == Py_None || s->recompute) {
        if (attr_ll(s->modules, str_current, &module) < 0 || capture(s, frame, &stack) < 0 ||
            call_ll(PyTuple_GET_ITEM(ts, 1), &enabled) < 0 ||
            remember_nodes(s, frame, stack, module, (int)enabled, &made) < 0)
            goto done;
        if (node != Py_None)    /* checkpointing replays it: recompute, unless annotated */
            phase = !has_hint || hint <= PHASE_BACKWARD ? PHASE_RECOMPUTE : hint;
        else if (has_hint)
            phase = hint;
        else if (s->in_optimizer)
            phase = PHASE_OPTIMIZER;
        else if (module >= 0 || made)   /* outside modules: what autograd records */
            phase = PHASE_FORWARD;
        else {
            long long task;
            if (call_ll(PyTuple_GET_ITEM(ts, 2), &task) < 0)
                goto done;
            phase = task >= 0 ? PHASE_GRAD_SYNC : PHASE_OTHER;
        }
    }
    else {
        phase = has_hint && hint > PHASE_BACKWARD ? hint : PHASE_BACKWARD;
        if (node_origin(s, node, &fwd_stack, &module, &nseq) < 0 ||   /* its saved: memory */
            (memory_on(s) && storage_table_node_runs(s->memory_table, node, nseq) < 0) ||
            capture(s, frame, &stack) < 0)
            goto done;
    }
    if (thread_number(s, &thread) < 0 || shape_id(s, args, &shapes) < 0 ||
        attr_ll(s->annotations, str_current, &annotation) < 0)
        goto done;
    v[0] = t0, v[1] = t1, v[2] = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 0)), v[3] = phase;
    v[4] = module, v[5] = stack, v[6] = fwd_stack, v[7] = annotation, v[8] = s->step_index;
    v[9] = thread, v[10] = shapes, v[11] = -1;
    if ((v[2] == -1 && PyErr_Occurred()) || queue_row(s, v) < 0)
        goto done;
    s->last_event_ns = t1;
    if (memory_on(s) && storage_table_outputs(s->memory_table, PyTuple_GET_ITEM(entry, 4), out,
                                              t0, thread, 0) < 0)
        goto done;                                   /* the storages it made (memory_recorder.py) */
    Py_ssize_t queued = PyObject_Length(s->queue);
    if (queued < 0)
        goto done;
    if (queued > MAX_QUEUE) {
        PyObject *flusher = PyObject_GetAttr((PyObject *)s, str_flusher);
        PyObject *flushed = flusher ? PyObject_CallMethodNoArgs(flusher, str_flush) : NULL;
        Py_XDECREF(flusher);
        if (flushed == NULL)
            goto done;
        Py_DECREF(flushed);
    }
    failed = 0;
done:
    Py_DECREF(node);
    Py_XDECREF(hint_obj);
    return failed;
}

/* on_op for a plain-tensor op: its result, or NULL with *handled 0 (and no error) when the
   Python twin must take it (OpDispatch, sessiontypes.c, calls it). */
PyObject *
session_on_op(SessionState *s, PyObject *func, PyObject *args, PyObject *kwargs, int *handled)
{
    *handled = 0;
    if (!session_is_ready(s))
        return NULL;
    PyObject *entry = entry_of(s, func);
    if (entry == NULL) {      /* not classified yet, or failed: the twin takes it */
        *handled = PyErr_Occurred() != NULL && session_failed(s) < 0;
        return NULL;
    }
    PyObject *call = PyTuple_GET_ITEM(entry, 3);
    if (s->passthrough) {
        *handled = 1;
        return PyObject_Call(call, args, kwargs);
    }
    /* pending functional collectives and c10d futures: the Python twin settles them first */
    int funcol = PyDict_GET_SIZE(s->futures) > 0 ? 1
        : PyDict_Check(s->funcol) ? PyDict_GET_SIZE(s->funcol) > 0 : PyObject_IsTrue(s->funcol);
    if (funcol < 0 && session_failed(s) == 0) {
        *handled = 1;
        return PyObject_Call(call, args, kwargs);
    }
    if (funcol != 0 || PyTuple_GET_ITEM(entry, 1) != Py_None ||
        PyTuple_GET_ITEM(entry, 2) != Py_None || (s->device_wanted && !s->open_ranges)) {
        *handled = funcol < 0;
        return NULL;
    }
    PyFrameObject *frame = PyEval_GetFrame();   /* the caller: on_op's sys._getframe(2) */
    if (frame == NULL)
        return NULL;
    Py_INCREF(frame);
    *handled = 1;
    long long t0 = now_ns();
    PyObject *out = PyObject_Call(call, args, kwargs);
    long long t1 = now_ns();
    if (out != NULL && record(s, entry, args, out, frame, t0, t1) < 0 && session_failed(s) < 0)
        Py_CLEAR(out);
    Py_DECREF(frame);
    return out;
}
