/* StackWalk: StackInterner.capture in C; tracer/recorder/attribution/stacks.py's _PyStackWalk is
 * its twin. */
#include "hotpath.h"

/* tracer/recorder/attribution/stacks.py's FX_NODE: the kind of torch.fx.Interpreter.run_node,
   whose frames are keyed by the graph node they run as well (one code and instruction run every
   node) */
#define FX_NODE 3

/* The {f_lasti: node} table of a run_node frame under a parent node (borrowed: the siblings
   table holds it), from the subclass's _fx_siblings: one per graph node. */
static PyObject *
fx_sibling_table(StackWalk *self, PyFrameObject *frame, Py_ssize_t parent)
{
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("_fx_siblings")) == NULL)
        return NULL;
    PyObject *node = PyLong_FromSsize_t(parent);
    if (node == NULL)
        return NULL;
    PyObject *args[] = {(PyObject *)self, node, (PyObject *)frame};
    PyObject *table = PyObject_VectorcallMethod(name, args, 3 | PY_VECTORCALL_ARGUMENTS_OFFSET,
                                                NULL);
    Py_DECREF(node);
    if (table == NULL)
        return NULL;
    int is_dict = PyDict_Check(table);
    Py_DECREF(table);
    if (!is_dict) {
        PyErr_SetString(PyExc_TypeError, "StackWalk: an FX node's siblings entry is not a dict");
        return NULL;
    }
    return table;
}

/* A capture's answer: the stack id, or NULL with the error (a negative id without one: said). */
static PyObject *
sid_result(Py_ssize_t sid)
{
    if (sid >= 0)
        return PyLong_FromSsize_t(sid);
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "StackWalk: a stack id is negative");
    return NULL;
}

/* _walk: the frames from ``start`` outward up to the first one on the path.
 *
 * NOTE: a new node or stack runs Python (_new_node, _sid, classify), where another thread that
 * records may capture too and change the path. That cannot make a stack wrong (a node's stack
 * is its own parent chain, whatever the path holds), but it can leave an index found here
 * beyond the path's end: then the path is forgotten and the walk starts again
 * (``retries`` times). */
static PyObject *
walk_frames(StackWalk *self, PyFrameObject *start, int retries)
{
    PyFrameObject *frame = start, *f = NULL;
    PyObject *changed = NULL, *lasti = NULL, *parent = NULL, *entry = NULL;
    PyObject *innermost = NULL;       /* the path entry of ``frame``, once known */
    Py_ssize_t node = -1, sid, at = -1;
    int bits = -1, stale = 0;

    Py_INCREF(frame);
    while (frame != NULL) {           /* skip paratrace's and dispatch frames */
        bits = frame_bits(self, frame);
        if (bits < 0)
            goto error;
        if ((bits & ~RESUMABLE) != INTERNAL)
            break;
        PyFrameObject *back = PyFrame_GetBack(frame);
        Py_DECREF(frame);
        frame = back;
    }
    if (frame == NULL) {
        sid = node_sid(self, -1);
        if (sid >= 0)
            set_last(self, Py_None, Py_None, self->last_lasti, sid);
        return sid_result(sid);
    }
    changed = PyList_New(0);
    if (changed == NULL)
        goto error;
    f = frame;
    Py_INCREF(f);
    for (;;) {                        /* up to the first frame on the path */
        PyObject *pos = PyDict_GetItemWithError(self->path_pos, (PyObject *)f);
        if (pos != NULL) {            /* the same live frame: its callers are too */
            at = PyLong_AsSsize_t(pos);
            if (at == -1 && PyErr_Occurred())
                goto error;
            if (at < 0 || at >= PyList_GET_SIZE(self->path)) {
                stale = 1;
                break;
            }
            innermost = PyList_GET_ITEM(self->path, at);
            Py_INCREF(innermost);
            node = move_entry(self, innermost, f, PyFrame_GetLasti(f));
            if (node < 0)
                goto error;
            break;
        }
        if (PyErr_Occurred())
            goto error;
        if ((bits & ~RESUMABLE) != INTERNAL && PyList_Append(changed, (PyObject *)f) < 0)
            goto error;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
        if (f == NULL) {
            at = -1;
            break;
        }
        bits = frame_bits(self, f);
        if (bits < 0)
            goto error;
    }
    Py_CLEAR(f);
    if (stale) {
        Py_CLEAR(changed);
        Py_CLEAR(frame);
        Py_CLEAR(innermost);
        if (retries <= 0) {
            PyErr_SetString(PyExc_RuntimeError, "StackWalk: the path keeps changing under a walk");
            return NULL;
        }
        if (reset_path(self) < 0)
            return NULL;
        return walk_frames(self, start, retries - 1);
    }
    if (drop_after(self, at) < 0)
        goto error;
    for (Py_ssize_t i = PyList_GET_SIZE(changed) - 1; i >= 0; i--) {
        PyFrameObject *g = (PyFrameObject *)PyList_GET_ITEM(changed, i);
        PyCodeObject *code = PyFrame_GetCode(g);
        bits = code_bits(self, code);
        PyObject *lastis = bits < 0 ? NULL : (bits & ~RESUMABLE) == FX_NODE
            ? fx_sibling_table(self, g, node) : sibling_table(self, code, node);   /* borrowed */
        Py_DECREF(code);
        if (lastis == NULL)
            goto error;
        parent = PyLong_FromSsize_t(node);
        lasti = PyLong_FromLong(PyFrame_GetLasti(g));
        if (parent == NULL || lasti == NULL)
            goto error;
        node = child_node(self, lastis, parent, g, lasti);
        if (node < 0)
            goto error;
        if (!(bits & RESUMABLE)) {
            /* NOTE: a generator's frame is never looked up: another caller may resume it */
            PyObject *index = PyLong_FromSsize_t(PyList_GET_SIZE(self->path));
            if (index == NULL)
                goto error;
            int failed = PyDict_SetItem(self->path_pos, (PyObject *)g, index);
            Py_DECREF(index);
            if (failed < 0)
                goto error;
        }
        PyObject *value = PyLong_FromSsize_t(node);
        if (value == NULL)
            goto error;
        entry = PyList_New(5);
        if (entry == NULL) {
            Py_DECREF(value);
            goto error;
        }
        Py_INCREF(g);
        Py_INCREF(lastis);
        PyList_SET_ITEM(entry, 0, (PyObject *)g);
        PyList_SET_ITEM(entry, 1, lasti);          /* steals */
        PyList_SET_ITEM(entry, 2, value);
        PyList_SET_ITEM(entry, 3, lastis);
        PyList_SET_ITEM(entry, 4, parent);
        lasti = parent = NULL;
        if (PyList_Append(self->path, entry) < 0)
            goto error;
        if (i == 0) {                 /* the innermost kept frame: ``frame`` */
            Py_XSETREF(innermost, entry);
            entry = NULL;
        }
        Py_CLEAR(entry);
    }
    Py_CLEAR(changed);
    int start_bits = frame_bits(self, start), frame_bits_ = frame_bits(self, frame);
    if (start_bits < 0 || frame_bits_ < 0)
        goto error;
    int resumable = (start_bits | frame_bits_) & RESUMABLE;
    sid = node_sid(self, node);
    if (sid < 0) {
        sid_result(sid);
        goto error;
    }
    if (innermost == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "StackWalk: a walk kept no frame");
        goto error;
    }
    /* NOTE: all four at once, after the last call that may run Python */
    set_last(self, resumable ? Py_None : (PyObject *)start, frame == start ? innermost : Py_None,
             PyFrame_GetLasti(start), sid);
    Py_CLEAR(innermost);
    Py_CLEAR(frame);
    return PyLong_FromSsize_t(sid);

error:
    Py_XDECREF(innermost);
    Py_XDECREF(frame);
    Py_XDECREF(f);
    Py_XDECREF(changed);
    Py_XDECREF(parent);
    Py_XDECREF(lasti);
    Py_XDECREF(entry);
    return NULL;
}

PyObject *
walk_capture(StackWalk *self, PyObject *arg)
{
    if (!PyFrame_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "capture() takes a frame");
        return NULL;
    }
    if (!walk_ready(self))
        return NULL;
    PyFrameObject *frame = (PyFrameObject *)arg;
    Py_ssize_t sid;
    if (arg == self->last_start) {
        int lasti = PyFrame_GetLasti(frame);
        PyObject *entry = self->last_entry;
        if (lasti == self->last_lasti || entry == Py_None || entry == NULL)
            /* the same instruction (e.g. every op of one loss.backward()), or a dispatch
               frame: the stack is its callers', which cannot change while it lives */
            return PyLong_FromSsize_t(self->last_sid);
        /* the same function, a later instruction (half of all captures) */
        Py_INCREF(entry);
        Py_ssize_t node = move_entry(self, entry, frame, lasti);
        sid = node < 0 ? -1 : node_sid(self, node);
        if (sid >= 0 && self->last_start == arg && self->last_entry == entry) {
            self->last_lasti = lasti;    /* (unless another thread's capture moved them) */
            self->last_sid = sid;
        }
        Py_DECREF(entry);
        return sid_result(sid);
    }
    PyObject *pos = PyDict_GetItemWithError(self->path_pos, arg);
    if (pos == NULL) {
        if (PyErr_Occurred())
            return NULL;
        return walk_frames(self, frame, 2);
    }
    /* a function on the last stack (a call it made returned): the frames it called go */
    Py_ssize_t at = PyLong_AsSsize_t(pos);
    if (at == -1 && PyErr_Occurred())
        return NULL;
    if (at >= 0 && at < PyList_GET_SIZE(self->path) && drop_after(self, at) < 0)
        return NULL;
    if (at < 0 || at >= PyList_GET_SIZE(self->path)) {      /* see walk_frames */
        if (reset_path(self) < 0)
            return NULL;
        return walk_frames(self, frame, 2);
    }
    PyObject *entry = PyList_GET_ITEM(self->path, at);
    Py_INCREF(entry);
    int lasti = PyFrame_GetLasti(frame);
    Py_ssize_t node = move_entry(self, entry, frame, lasti);
    sid = node < 0 ? -1 : node_sid(self, node);
    if (sid >= 0)
        set_last(self, arg, entry, lasti, sid);
    Py_DECREF(entry);
    return sid_result(sid);
}

static PyMethodDef walk_methods[] = {
    {"capture", (PyCFunction)walk_capture, METH_O,
     "Intern the stack that starts at frame (innermost) and return its id."},
    {NULL},
};

static PyMemberDef walk_members[] = {
    {"kind_of_code", T_OBJECT, offsetof(StackWalk, kind_of_code), 0, NULL},
    {"_siblings", T_OBJECT, offsetof(StackWalk, siblings), 0, NULL},
    {"_node_sid", T_OBJECT, offsetof(StackWalk, node_sid), 0, NULL},
    {"_path", T_OBJECT, offsetof(StackWalk, path), 0, NULL},
    {"_path_pos", T_OBJECT, offsetof(StackWalk, path_pos), 0, NULL},
    {"_last_start", T_OBJECT, offsetof(StackWalk, last_start), 0, NULL},
    {"_last_entry", T_OBJECT, offsetof(StackWalk, last_entry), 0, NULL},
    {"_last_lasti", T_PYSSIZET, offsetof(StackWalk, last_lasti), 0, NULL},
    {"_last_sid", T_PYSSIZET, offsetof(StackWalk, last_sid), 0, NULL},
    {NULL},
};

PyTypeObject StackWalkType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.recorder._hotpath.StackWalk",
    .tp_basicsize = sizeof(StackWalk),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "StackInterner's capture in C (tracer/recorder/attribution/stacks.py has its "
              "Python twin).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)walk_traverse,
    .tp_clear = (inquiry)walk_clear,
    .tp_dealloc = (destructor)walk_dealloc,
    .tp_methods = walk_methods,
    .tp_members = walk_members,
};
