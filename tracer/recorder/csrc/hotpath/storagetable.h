/* The storage table's types, shared by storagetable.c (the table's work) and storagetypes.c (its
 * Python side and the types); hotpath.h has what the rest of the hot path calls. */
#ifndef PARATRACE_STORAGETABLE_H
#define PARATRACE_STORAGETABLE_H

#include "hotpath.h"

#if PY_VERSION_HEX >= 0x030D0000
#define lookup_attr PyObject_GetOptionalAttr
#else
#define lookup_attr _PyObject_LookupAttr
#endif

#define TEMPORARIES 0      /* storage_table.py's categories, in order */
#define COMM 1
#define ACTIVATIONS 2
#define ALLOC 0            /* and its event kinds */
#define FREE 1
#define RECLASS 2
#define EVENT_FIELDS 7     /* kind, storage id, bytes, time, category, thread (-1), step */

typedef struct {
    PyWeakReference ref;
    unsigned long long key;   /* the storage key: its StorageImpl's address */
    long long sid, nbytes;
    int category;
} StorageRef;

typedef struct {
    PyObject_HEAD
    PyObject *live;           /* storage key (int) -> StorageRef */
    PyObject *on_free;        /* the entries' callback: table_freed bound to this table */
    PyObject *names;          /* autograd node type -> its saved tensors' getter names */
    PyObject *session;        /* a SessionState: each event's step */
    PyObject *storage_key;    /* compat.storage_key */
    PyObject *tensor_type;    /* torch.Tensor */
    PyObject *only_aliases;   /* compat.returns_only_aliases */
    PtrMap aliasing;          /* op overload -> 1: it returns only aliases, 2: not (held) */
    long long next_id;
    unsigned long long last_seq;
    PyObject *last_type;      /* borrowed, only compared: the type of the node last read */
    int open;
    long long *events;        /* EVENT_FIELDS per event, since the last take */
    Py_ssize_t count, capacity;
} StorageTable;

/* attribute and method names, interned once (storagetypes.c) */
extern PyObject *str_untyped_storage, *str_nbytes, *str_is_meta, *str_cdata, *str_data,
    *str_local_tensor, *str_raw_saved;

/* storagetable.c: what the Python side's methods (storagetypes.c) call */
int table_saved(StorageTable *t, PyObject *tensor);
PyObject *table_freed(StorageTable *t, PyObject *ref);
PyObject *table_claim(StorageTable *t, PyObject *const *args, Py_ssize_t n);
PyObject *table_resized(StorageTable *t, PyObject *storage);

#endif
