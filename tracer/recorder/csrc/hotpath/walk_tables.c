/* StackWalk's tables: what a capture asks of the Python side, cached, and the path's upkeep.
   Each function mirrors a line or a method of tracer/recorder/attribution/stacks.py's
   _PyStackWalk. */
#include "hotpath.h"

int
walk_traverse(StackWalk *self, visitproc visit, void *arg)
{
    Py_VISIT(self->kind_of_code);
    Py_VISIT(self->siblings);
    Py_VISIT(self->node_sid);
    Py_VISIT(self->path);
    Py_VISIT(self->path_pos);
    Py_VISIT(self->last_start);
    Py_VISIT(self->last_entry);
    int failed = map_traverse(&self->codes, visit, arg);
    return failed ? failed : map_traverse(&self->lastis, visit, arg);
}

int
walk_clear(StackWalk *self)
{
    Py_CLEAR(self->kind_of_code);
    Py_CLEAR(self->siblings);
    Py_CLEAR(self->node_sid);
    Py_CLEAR(self->path);
    Py_CLEAR(self->path_pos);
    Py_CLEAR(self->last_start);
    Py_CLEAR(self->last_entry);
    map_clear(&self->codes);
    map_clear(&self->lastis);
    return 0;
}

void
walk_dealloc(StackWalk *self)
{
    PyObject_GC_UnTrack(self);
    walk_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int
walk_ready(StackWalk *self)
{
    if (self->kind_of_code == NULL || !PyDict_Check(self->kind_of_code) ||
        self->siblings == NULL || !PyDict_Check(self->siblings) ||
        self->node_sid == NULL || !PyList_Check(self->node_sid) ||
        self->path == NULL || !PyList_Check(self->path) ||
        self->path_pos == NULL || !PyDict_Check(self->path_pos)) {
        PyErr_SetString(PyExc_TypeError, "StackWalk: its tables are not set up");
        return 0;
    }
    return 1;
}

/* A code object's kind | RESUMABLE when it is a generator's or coroutine's; -1 on error. */
int
code_bits(StackWalk *self, PyCodeObject *code)
{
    Slot *slot = map_find(&self->codes, code, 0);
    if (slot != NULL)
        return (int)(intptr_t)slot->value;
    PyObject *key = PyLong_FromVoidPtr(code);
    if (key == NULL)
        return -1;
    PyObject *known = PyDict_GetItemWithError(self->kind_of_code, key);
    Py_DECREF(key);
    if (known != NULL) {
        Py_INCREF(known);
    }
    else if (!PyErr_Occurred()) {
        known = PyObject_CallMethodOneArg((PyObject *)self, str_classify, (PyObject *)code);
    }
    if (known == NULL)
        return -1;
    int bits = -1;
    if (!PyTuple_Check(known) || PyTuple_GET_SIZE(known) < 2) {
        PyErr_SetString(PyExc_TypeError,
                        "StackWalk: a code's kind is not a (kind, resumable) tuple");
    }
    else {
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(known, 0));
        int resumable = PyObject_IsTrue(PyTuple_GET_ITEM(known, 1));
        if (kind < 0 || kind >= RESUMABLE) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "StackWalk: a code's kind is out of range");
        }
        else if (resumable >= 0) {
            bits = (int)kind | (resumable ? RESUMABLE : 0);
            if (map_add(&self->codes, code, 0, (void *)(intptr_t)bits, (PyObject *)code) < 0)
                bits = -1;
        }
    }
    Py_DECREF(known);
    return bits;
}

int
frame_bits(StackWalk *self, PyFrameObject *frame)
{
    PyCodeObject *code = PyFrame_GetCode(frame);
    int bits = code_bits(self, code);
    Py_DECREF(code);
    return bits;
}

/* The {f_lasti: node} table of a code under a parent node (borrowed; made when new). */
PyObject *
sibling_table(StackWalk *self, PyCodeObject *code, Py_ssize_t parent)
{
    Slot *slot = map_find(&self->lastis, code, parent);
    if (slot != NULL)
        return slot->owned;
    PyObject *code_id = PyLong_FromVoidPtr(code);
    PyObject *node = PyLong_FromSsize_t(parent);
    PyObject *key = code_id && node ? PyTuple_Pack(2, node, code_id) : NULL;
    Py_XDECREF(code_id);
    Py_XDECREF(node);
    if (key == NULL)
        return NULL;
    PyObject *table = PyDict_GetItemWithError(self->siblings, key);   /* borrowed */
    if (table == NULL && !PyErr_Occurred()) {
        table = PyDict_New();
        if (table != NULL && PyDict_SetItem(self->siblings, key, table) < 0)
            Py_CLEAR(table);
        Py_XDECREF(table);     /* the siblings table holds it */
    }
    Py_DECREF(key);
    if (table != NULL && !PyDict_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "StackWalk: a siblings entry is not a dict");
        return NULL;
    }
    if (table != NULL && map_add(&self->lastis, code, parent, NULL, table) < 0)
        return NULL;
    return table;
}

/* The stack id of a node: its cached id, else the subclass's _sid (or _root for no node). */
Py_ssize_t
node_sid(StackWalk *self, Py_ssize_t node)
{
    PyObject *result;
    if (node >= 0 && node < PyList_GET_SIZE(self->node_sid)) {
        Py_ssize_t sid = PyLong_AsSsize_t(PyList_GET_ITEM(self->node_sid, node));
        if (sid >= 0 || PyErr_Occurred())
            return sid;
    }
    if (node < 0) {
        result = PyObject_CallMethodNoArgs((PyObject *)self, str_root);
    }
    else {
        PyObject *arg = PyLong_FromSsize_t(node);
        if (arg == NULL)
            return -1;
        result = PyObject_CallMethodOneArg((PyObject *)self, str_sid, arg);
        Py_DECREF(arg);
    }
    if (result == NULL)
        return -1;
    Py_ssize_t sid = PyLong_AsSsize_t(result);
    Py_DECREF(result);
    return sid;
}

/* The node of ``frame`` at ``lasti`` among its siblings ``lastis``, made when new. */
Py_ssize_t
child_node(StackWalk *self, PyObject *lastis, PyObject *parent, PyFrameObject *frame,
           PyObject *lasti)
{
    PyObject *node = PyDict_GetItemWithError(lastis, lasti);
    if (node != NULL)
        return PyLong_AsSsize_t(node);
    if (PyErr_Occurred())
        return -1;
    PyObject *args[] = {(PyObject *)self, parent, (PyObject *)frame, lasti, lastis};
    PyObject *made = PyObject_VectorcallMethod(str_new_node, args,
                                               5 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (made == NULL)
        return -1;
    Py_ssize_t result = PyLong_AsSsize_t(made);
    Py_DECREF(made);
    return result;
}

/* _move: the node of the path entry of ``frame``, now at ``lasti`` (the entry follows it);
   -1 on error (nodes are >= 0). */
Py_ssize_t
move_entry(StackWalk *self, PyObject *entry, PyFrameObject *frame, int lasti)
{
    /* NOTE: held: a new node runs Python (_new_node), and another thread recording then may
       drop this entry from the path */
    Py_INCREF(entry);
    Py_ssize_t node = -1;
    long was = PyLong_AsLong(PyList_GET_ITEM(entry, 1));
    if (was == -1 && PyErr_Occurred())
        goto done;
    if (was != lasti) {
        PyObject *key = PyLong_FromLong(lasti);
        if (key == NULL)
            goto done;
        node = child_node(self, PyList_GET_ITEM(entry, 3), PyList_GET_ITEM(entry, 4), frame, key);
        PyObject *value = node < 0 ? NULL : PyLong_FromSsize_t(node);
        if (value == NULL) {
            Py_DECREF(key);
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "StackWalk: a node id is negative");
            node = -1;
            goto done;
        }
        PyList_SetItem(entry, 1, key);      /* steals both */
        PyList_SetItem(entry, 2, value);
    }
    node = PyLong_AsSsize_t(PyList_GET_ITEM(entry, 2));
done:
    Py_DECREF(entry);
    return node;
}

/* Forget the whole path (a capture found it changed under it: see walk_frames). */
int
reset_path(StackWalk *self)
{
    set_last(self, Py_None, Py_None, -1, -1);
    PyDict_Clear(self->path_pos);
    return PyList_SetSlice(self->path, 0, PyList_GET_SIZE(self->path), NULL);
}

/* _drop_after: forget the path's frames inward of index ``at`` (-1: all of them). */
int
drop_after(StackWalk *self, Py_ssize_t at)
{
    Py_ssize_t n = PyList_GET_SIZE(self->path);
    if (n <= at + 1)
        return 0;
    for (Py_ssize_t i = at + 1; i < n; i++) {
        PyObject *gone = PyList_GET_ITEM(PyList_GET_ITEM(self->path, i), 0);
        if (PyDict_DelItem(self->path_pos, gone) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError))
                return -1;
            PyErr_Clear();
        }
    }
    return PyList_SetSlice(self->path, at + 1, n, NULL);
}

void
set_last(StackWalk *self, PyObject *start, PyObject *entry, Py_ssize_t lasti, Py_ssize_t sid)
{
    PyObject *old_start = self->last_start, *old_entry = self->last_entry;
    Py_INCREF(start);
    Py_INCREF(entry);
    self->last_start = start;
    self->last_entry = entry;
    self->last_lasti = lasti;
    self->last_sid = sid;
    Py_XDECREF(old_start);     /* last: freeing a frame may run Python */
    Py_XDECREF(old_entry);
}
