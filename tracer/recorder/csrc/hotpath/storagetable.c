/* StorageTable: memory recording's storage table in C; tracer/recorder/memory/storage_table.py's
 * PyStorageTable is its twin, step for step (read that module for what a table does and why).
 *
 * The C on_op (onop.c) calls storage_table_outputs and storage_table_node_runs directly, so
 * a plain op's first sight, and a node's saved tensors, cost no Python frame. An entry is a
 * StorageRef: a weak reference to the storage (a subclass of weakref.ref with the entry's
 * fields), whose callback is the table's C free; the events are int64 rows in a C array that
 * take() hands to the flusher as one bytes object, so writing them holds the GIL for one copy,
 * not a Python loop over the rows. The step of each event is read from the session
 * (a SessionState) as it happens.
 */
#include "storagetable.h"

/* ------------------------------------------------------------------ helpers */
static int
to_ll(PyObject *value, long long *out)      /* steals value */
{
    if (value == NULL)
        return -1;
    *out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
}

/* an error that says the tensor has no storage (sparse, nested, a subclass): cleared, 1 */
static int
no_storage(int attribute_too)
{
    if (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
        PyErr_ExceptionMatches(PyExc_NotImplementedError) ||
        PyErr_ExceptionMatches(PyExc_TypeError) ||
        (attribute_too && PyErr_ExceptionMatches(PyExc_AttributeError))) {
        PyErr_Clear();
        return 1;
    }
    return 0;
}

static int
push_event(StorageTable *t, long long kind, long long sid, long long nbytes, long long at,
           long long category, long long thread)
{
    if (t->count == t->capacity) {
        Py_ssize_t capacity = t->capacity ? 2 * t->capacity : 4096;
        long long *grown = PyMem_Realloc(t->events,
                                         (size_t)capacity * EVENT_FIELDS * sizeof(long long));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->events = grown;
        t->capacity = capacity;
    }
    long long *e = t->events + EVENT_FIELDS * t->count++;
    e[0] = kind, e[1] = sid, e[2] = nbytes, e[3] = at, e[4] = category, e[5] = thread;
    e[6] = ((SessionState *)t->session)->step_index;
    return 0;
}

static int
reclass(StorageTable *t, StorageRef *entry, int category)
{
    entry->category = category;
    return push_event(t, RECLASS, entry->sid, entry->nbytes, now_ns(), category, -1);
}

/* a storage not in the table (not a meta one: the callers check) becomes an entry */
static int
new_entry(StorageTable *t, PyObject *storage, PyObject *key, long long at, long long thread,
          int category)
{
    long long nbytes;
    unsigned long long address = PyLong_AsUnsignedLongLong(key);
    if ((address == (unsigned long long)-1 && PyErr_Occurred()) ||
        to_ll(PyObject_CallMethodNoArgs(storage, str_nbytes), &nbytes) < 0)
        return -1;
    PyObject *args = PyTuple_Pack(2, storage, t->on_free);
    if (args == NULL)
        return -1;
    StorageRef *entry = (StorageRef *)_PyWeakref_RefType.tp_new(&StorageRefType, args, NULL);
    Py_DECREF(args);
    if (entry == NULL)
        return -1;
    entry->key = address, entry->sid = t->next_id++, entry->nbytes = nbytes;
    entry->category = category;
    int failed = PyDict_SetItem(t->live, key, (PyObject *)entry);
    long long sid = entry->sid;
    Py_DECREF(entry);
    return failed < 0 ? -1 : push_event(t, ALLOC, sid, nbytes, at, category, thread);
}

static StorageRef *
entry_of(StorageTable *t, PyObject *key)   /* borrowed, or NULL (an error set, or none) */
{
    return (StorageRef *)PyDict_GetItemWithError(t->live, key);
}

/* ------------------------------------------------------------------ hot path */
/* PyStorageTable._see: an output tensor's storage */
static int
see_tensor(StorageTable *t, PyObject *tensor, long long t0, long long thread, int comm)
{
    PyObject *key = PyObject_CallOneArg(t->storage_key, tensor);
    if (key == NULL)
        return no_storage(0) ? 0 : -1;
    int failed = -1;
    StorageRef *entry = entry_of(t, key);
    if (entry != NULL) {
        failed = comm && entry->category < COMM ? reclass(t, entry, COMM) : 0;
        goto done;
    }
    if (PyErr_Occurred())
        goto done;
    PyObject *meta = PyObject_GetAttr(tensor, str_is_meta);
    int is_meta = meta == NULL ? -1 : PyObject_IsTrue(meta);
    Py_XDECREF(meta);
    if (is_meta != 0) {
        failed = is_meta < 0 ? -1 : 0;
        goto done;
    }
    PyObject *storage = PyObject_CallMethodNoArgs(tensor, str_untyped_storage);
    if (storage == NULL) {
        failed = no_storage(0) ? 0 : -1;
        goto done;
    }
    failed = new_entry(t, storage, key, t0, thread, comm ? COMM : TEMPORARIES);
    Py_DECREF(storage);
done:
    Py_DECREF(key);
    return failed;
}

static int
see_item(StorageTable *t, PyObject *item, long long t0, long long thread, int comm)
{
    int is = PyObject_IsInstance(item, t->tensor_type);
    if (is <= 0)
        return is;
    return see_tensor(t, item, t0, thread, comm) < 0 ? -1 : 1;
}

/* the op overload returns only its arguments or views of them: 1, not: 0, an error: -1 */
static int
only_aliases(StorageTable *t, PyObject *func)
{
    Slot *slot = map_find(&t->aliasing, func, 0);
    if (slot != NULL)
        return slot->value == (void *)1;
    PyObject *answer = PyObject_CallOneArg(t->only_aliases, func);
    int only = answer == NULL ? -1 : PyObject_IsTrue(answer);
    Py_XDECREF(answer);
    void *value = (void *)(uintptr_t)(only ? 1 : 2);
    if (only < 0 || map_add(&t->aliasing, func, 0, value, func) < 0)
        return -1;
    return only;
}

int
storage_table_outputs(PyObject *table, PyObject *func, PyObject *out, long long t0,
                      long long thread, int comm)
{
    StorageTable *t = (StorageTable *)table;
    if (!comm) {
        int only = only_aliases(t, func);
        if (only != 0)
            return only < 0 ? -1 : 0;     /* an error, or no storage made */
    }
    if (Py_IS_TYPE(out, (PyTypeObject *)t->tensor_type))
        return see_tensor(t, out, t0, thread, comm);
    if (!PyTuple_Check(out) && !PyList_Check(out))
        return 0;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(out); i++) {
        PyObject *value = PySequence_Fast_GET_ITEM(out, i);
        int is = see_item(t, value, t0, thread, comm);
        if (is < 0)
            return -1;
        if (is || (!PyTuple_Check(value) && !PyList_Check(value)))
            continue;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(value); j++)
            if (see_item(t, PySequence_Fast_GET_ITEM(value, j), t0, thread, comm) < 0)
                return -1;
    }
    return 0;
}

/* PyStorageTable.saved */
int
table_saved(StorageTable *t, PyObject *tensor)
{
    if (!t->open || !Py_IS_TYPE(tensor, (PyTypeObject *)t->tensor_type))
        return 0;
    PyObject *key = PyObject_CallOneArg(t->storage_key, tensor);
    if (key == NULL) {
        if (PyErr_ExceptionMatches(PyExc_RuntimeError) ||
            PyErr_ExceptionMatches(PyExc_NotImplementedError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    StorageRef *entry = entry_of(t, key);
    Py_DECREF(key);
    if (entry == NULL)
        return PyErr_Occurred() ? -1 : 0;
    return entry->category < ACTIVATIONS ? reclass(t, entry, ACTIVATIONS) : 0;
}

/* compat.saved_tensors for one SavedTensor: what autograd holds for it, when a tensor (a
   pack hook's holder is not; table_saved takes plain tensors only) */
static int
saved_one(StorageTable *t, PyObject *one)
{
    if (one == Py_None)
        return 0;
    PyObject *data = PyObject_GetAttr(one, str_data);
    if (data == NULL)
        return -1;
    int failed = table_saved(t, data);
    Py_DECREF(data);
    return failed;
}

/* compat.saved_tensor_names: the names in dir(type) that start with _raw_saved_ (sorted) */
static PyObject *
saved_names(StorageTable *t, PyObject *type)
{
    PyObject *names = PyDict_GetItemWithError(t->names, type);
    if (names != NULL || PyErr_Occurred())
        return names;
    PyObject *all = PyObject_Dir(type), *kept = PyList_New(0);
    if (all == NULL || kept == NULL)
        goto failed;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(all); i++) {
        PyObject *name = PyList_GET_ITEM(all, i);
        Py_ssize_t match = PyUnicode_Check(name) ?
            PyUnicode_Tailmatch(name, str_raw_saved, 0, PY_SSIZE_T_MAX, -1) : 0;
        if (match < 0 || (match && PyList_Append(kept, name) < 0))
            goto failed;
    }
    names = PyList_AsTuple(kept);
    if (names == NULL || PyDict_SetItem(t->names, type, names) < 0)
        goto failed;
    Py_DECREF(all);
    Py_DECREF(kept);
    Py_DECREF(names);          /* the dict holds it */
    return names;
failed:
    Py_XDECREF(all);
    Py_XDECREF(kept);
    Py_XDECREF(names);
    return NULL;
}

int
storage_table_node_runs(PyObject *table, PyObject *node, unsigned long long nseq)
{
    StorageTable *t = (StorageTable *)table;
    PyObject *type = (PyObject *)Py_TYPE(node);
    if (!t->open || (nseq == t->last_seq && type == t->last_type))
        return 0;
    t->last_seq = nseq, t->last_type = type;
    PyObject *names = saved_names(t, type);
    if (names == NULL)
        return -1;
    Py_INCREF(names);
    int failed = 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(names) && !failed; i++) {
        PyObject *value = PyObject_GetAttr(node, PyTuple_GET_ITEM(names, i));
        if (value == NULL) {      /* released already (PyStorageTable.node_runs): nothing */
            if (PyErr_ExceptionMatches(PyExc_RuntimeError))
                PyErr_Clear();
            else
                failed = 1;
        }
        else if (PyTuple_Check(value) || PyList_Check(value)) {
            for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(value) && !failed; j++)
                failed = saved_one(t, PySequence_Fast_GET_ITEM(value, j)) < 0;
        }
        else
            failed = saved_one(t, value) < 0;
        Py_XDECREF(value);
    }
    Py_DECREF(names);
    return failed ? -1 : 0;
}

/* ------------------------------------------------------------------ frees and walks */
/* PyStorageTable._freed: an entry's callback, its storage freed */
PyObject *
table_freed(StorageTable *t, PyObject *arg)
{
    if (!t->open || !PyObject_TypeCheck(arg, &StorageRefType))
        Py_RETURN_NONE;
    StorageRef *entry = (StorageRef *)Py_NewRef(arg);   /* the table's reference goes */
    PyObject *key = PyLong_FromUnsignedLongLong(entry->key), *result = NULL;
    if (key == NULL)
        goto done;
    StorageRef *held = entry_of(t, key);
    if (held != entry) {
        if (!PyErr_Occurred())
            result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyDict_DelItem(t->live, key) < 0 || (entry->sid >= 0 &&
        push_event(t, FREE, entry->sid, entry->nbytes, now_ns(), entry->category, -1) < 0))
        goto done;
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(key);
    Py_DECREF(entry);
    return result;
}

/* PyStorageTable.claim: tensor's storage is at least category */
PyObject *
table_claim(StorageTable *t, PyObject *const *args, Py_ssize_t n)
{
    int category;
    if (n != 2 || (category = PyLong_AsLong(args[1])) == -1) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "claim(tensor, category)");
        return NULL;
    }
    if (!t->open)
        Py_RETURN_NONE;
    PyObject *local = Py_NewRef(args[0]), *key = NULL, *storage = NULL;
    if (!Py_IS_TYPE(local, (PyTypeObject *)t->tensor_type)) {     /* compat.local_tensor */
        PyObject *inner;
        if (lookup_attr(local, str_local_tensor, &inner) < 0)
            goto failed;
        if (inner != NULL && PyObject_IsInstance(inner, t->tensor_type) == 1)
            Py_SETREF(local, inner);
        else
            Py_XDECREF(inner);
        if (PyErr_Occurred())
            goto failed;
    }
    key = PyObject_CallOneArg(t->storage_key, local);
    if (key == NULL) {
        if (!no_storage(1))
            goto failed;
        Py_DECREF(local);
        Py_RETURN_NONE;
    }
    StorageRef *entry = entry_of(t, key);
    if (entry != NULL) {
        if (category > entry->category && reclass(t, entry, category) < 0)
            goto failed;
    }
    else if (PyErr_Occurred())
        goto failed;
    else {
        PyObject *meta = PyObject_GetAttr(local, str_is_meta);
        int is_meta = meta == NULL ? -1 : PyObject_IsTrue(meta);
        Py_XDECREF(meta);
        if (is_meta < 0)
            goto failed;
        if (!is_meta && ((storage = PyObject_CallMethodNoArgs(local, str_untyped_storage)) ==
                         NULL || new_entry(t, storage, key, now_ns(), -1, category) < 0))
            goto failed;
    }
    Py_DECREF(local);
    Py_DECREF(key);
    Py_XDECREF(storage);
    Py_RETURN_NONE;
failed:
    Py_XDECREF(local);
    Py_XDECREF(key);
    Py_XDECREF(storage);
    return NULL;
}

/* PyStorageTable.resized: storage.resize_ changed its bytes */
PyObject *
table_resized(StorageTable *t, PyObject *storage)
{
    if (!t->open)
        Py_RETURN_NONE;
    PyObject *key = PyObject_GetAttr(storage, str_cdata);
    if (key == NULL)
        return NULL;
    StorageRef *entry = entry_of(t, key);
    Py_DECREF(key);
    if (entry == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    Py_INCREF(entry);
    long long nbytes, now = 0;
    int failed = to_ll(PyObject_CallMethodNoArgs(storage, str_nbytes), &nbytes);
    if (!failed && !(nbytes == entry->nbytes && entry->sid >= 0)) {
        now = now_ns();
        if (entry->sid >= 0)
            failed = push_event(t, FREE, entry->sid, entry->nbytes, now, entry->category, -1);
        entry->sid = -1, entry->nbytes = nbytes;
        if (!failed && nbytes > 0) {
            entry->sid = t->next_id++;
            failed = push_event(t, ALLOC, entry->sid, nbytes, now, entry->category, -1);
        }
    }
    Py_DECREF(entry);
    return failed ? NULL : Py_NewRef(Py_None);
}

