/* StorageTable's Python side (storagetable.c has the table's work): the methods the Python side
 * calls (storage_table.py's PyStorageTable has the same), the types, and the names they look
 * up. StorageRef, a table's entry, is a subclass of weakref.ref with the entry's fields. */
#include "storagetable.h"

PyObject *str_untyped_storage, *str_nbytes, *str_is_meta, *str_cdata, *str_data,
    *str_local_tensor, *str_raw_saved;

static PyMethodDef freed_def = {"freed", (PyCFunction)table_freed, METH_O,
                                "A storage of the table was freed (its entry's callback)."};

/* ------------------------------------------------------------------ the Python side */
static PyObject *
table_outputs(StorageTable *t, PyObject *const *args, Py_ssize_t n)
{
    long long t0, thread;
    int comm;
    if (n != 5) {
        PyErr_SetString(PyExc_TypeError, "outputs(func, out, t0, thread, comm)");
        return NULL;
    }
    t0 = PyLong_AsLongLong(args[2]);
    thread = PyLong_AsLongLong(args[3]);
    comm = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || comm < 0 || storage_table_outputs((PyObject *)t, args[0], args[1],
                                                               t0, thread, comm) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
table_node_runs(StorageTable *t, PyObject *const *args, Py_ssize_t n)
{
    unsigned long long nseq;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "node_runs(node, nseq)");
        return NULL;
    }
    nseq = PyLong_AsUnsignedLongLong(args[1]);
    if ((nseq == (unsigned long long)-1 && PyErr_Occurred()) ||
        storage_table_node_runs((PyObject *)t, args[0], nseq) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
saved_method(StorageTable *t, PyObject *tensor)
{
    return table_saved(t, tensor) < 0 ? NULL : Py_NewRef(Py_None);
}

static PyObject *
table_take(StorageTable *t, PyObject *unused)
{
    PyObject *out = PyBytes_FromStringAndSize((const char *)t->events,
                                              t->count * EVENT_FIELDS * sizeof(long long));
    if (out != NULL)
        t->count = 0;
    return out;
}

static PyObject *
table_close(StorageTable *t, PyObject *unused)
{
    t->open = 0;
    PyDict_Clear(t->live);
    Py_RETURN_NONE;
}

static PyMethodDef table_methods[] = {
    {"outputs", (PyCFunction)(void (*)(void))table_outputs, METH_FASTCALL,
     "outputs(func, out, t0, thread, comm): an op's result (PyStorageTable.outputs)."},
    {"node_runs", (PyCFunction)(void (*)(void))table_node_runs, METH_FASTCALL,
     "node_runs(node, nseq): a node runs in backward (PyStorageTable.node_runs)."},
    {"saved", (PyCFunction)saved_method, METH_O, "autograd keeps the tensor for backward."},
    {"claim", (PyCFunction)(void (*)(void))table_claim, METH_FASTCALL,
     "claim(tensor, category): its storage is at least category."},
    {"resized", (PyCFunction)table_resized, METH_O, "storage.resize_ changed its bytes."},
    {"take", (PyCFunction)table_take, METH_NOARGS,
     "The events since the last take, packed (storage_table.EVENT each)."},
    {"close", (PyCFunction)table_close, METH_NOARGS, "Forget the table: no more frees."},
    {NULL},
};

static PyObject *
table_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *session, *storage_key, *tensor_type, *only_aliases;
    if (!PyArg_ParseTuple(args, "O!OO!O:StorageTable", &SessionStateType, &session,
                          &storage_key, &PyType_Type, &tensor_type, &only_aliases))
        return NULL;
    StorageTable *t = (StorageTable *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->session = Py_NewRef(session);
    t->storage_key = Py_NewRef(storage_key);
    t->tensor_type = Py_NewRef(tensor_type);
    t->only_aliases = Py_NewRef(only_aliases);
    t->live = PyDict_New();
    t->names = PyDict_New();
    t->on_free = PyCFunction_New(&freed_def, (PyObject *)t);
    t->last_seq = 0, t->open = 1;
    if (t->live == NULL || t->names == NULL || t->on_free == NULL) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static int
table_traverse(StorageTable *t, visitproc visit, void *arg)
{
    Py_VISIT(t->live);
    Py_VISIT(t->on_free);
    Py_VISIT(t->names);
    Py_VISIT(t->session);
    Py_VISIT(t->storage_key);
    Py_VISIT(t->tensor_type);
    Py_VISIT(t->only_aliases);
    return map_traverse(&t->aliasing, visit, arg);
}

static int
table_clear(StorageTable *t)
{
    t->open = 0;
    Py_CLEAR(t->live);
    Py_CLEAR(t->on_free);
    Py_CLEAR(t->names);
    Py_CLEAR(t->session);
    Py_CLEAR(t->storage_key);
    Py_CLEAR(t->tensor_type);
    Py_CLEAR(t->only_aliases);
    map_clear(&t->aliasing);
    return 0;
}

static void
table_dealloc(StorageTable *t)
{
    PyObject_GC_UnTrack(t);
    table_clear(t);
    PyMem_Free(t->events);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static PyMemberDef table_members[] = {
    {"live", T_OBJECT, offsetof(StorageTable, live), READONLY,
     "storage key -> its entry (a StorageRef)"},
    {NULL},
};

PyTypeObject StorageTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.recorder._hotpath.StorageTable",
    .tp_basicsize = sizeof(StorageTable),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "StorageTable(session, storage_key, tensor_type, returns_only_aliases): memory "
              "recording's storage table (tracer/recorder/memory/storage_table.py's "
              "PyStorageTable in C).",
    .tp_new = table_new,
    .tp_traverse = (traverseproc)table_traverse,
    .tp_clear = (inquiry)table_clear,
    .tp_dealloc = (destructor)table_dealloc,
    .tp_methods = table_methods,
    .tp_members = table_members,
};

#define REF_FIELD(name, type, field) {name, type, offsetof(StorageRef, field), 0, NULL}
static PyMemberDef ref_members[] = {
    REF_FIELD("key", T_ULONGLONG, key),
    REF_FIELD("sid", T_LONGLONG, sid),
    REF_FIELD("nbytes", T_LONGLONG, nbytes),
    REF_FIELD("category", T_INT, category),
    {NULL},
};

PyTypeObject StorageRefType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.recorder._hotpath.StorageRef",
    .tp_basicsize = sizeof(StorageRef),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A storage in a StorageTable: a weak reference to it with what the table knows.",
    .tp_members = ref_members,
};

static int
intern(PyObject **name, const char *text)
{
    return (*name = PyUnicode_InternFromString(text)) == NULL ? -1 : 0;
}

int
storage_table_ready(void)
{
    StorageRefType.tp_base = &_PyWeakref_RefType;
    return (intern(&str_untyped_storage, "untyped_storage") < 0 ||
            intern(&str_nbytes, "nbytes") < 0 || intern(&str_is_meta, "is_meta") < 0 ||
            intern(&str_cdata, "_cdata") < 0 ||
            intern(&str_data, "data") < 0 || intern(&str_local_tensor, "_local_tensor") < 0 ||
            intern(&str_raw_saved, "_raw_saved_") < 0 ||
            PyType_Ready(&StorageRefType) < 0 || PyType_Ready(&StorageTableType) < 0) ? -1 : 0;
}
