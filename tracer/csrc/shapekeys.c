/* ShapeKeys: ShapeSignatures.id_of in C; tracer/shapes.py's _PyShapeKeys is its twin. */
#include "hotpath.h"

typedef struct {
    PyObject_HEAD
    PyObject *ids;            /* structured key -> signature id (the Python twin's; _new sets) */
    PyObject *byte_ids;       /* the same keys packed as bytes -> signature id (this one's) */
    PyObject *kind_of_type;   /* type -> 1 other, 2 tensor, 3 sequence */
    PyObject *kind;           /* type -> its kind, cached in kind_of_type */
    PyObject *tensor;         /* torch.Tensor */
    PyObject *parameter;      /* torch.nn.Parameter */
    PyObject *dtype_attr;     /* torch.Tensor.dtype's getset descriptor, or None */
    PyObject *shape_attr;     /* torch.Tensor.shape's, or None */
} ShapeKeys;

#define KIND_TENSOR 2
#define KIND_SEQUENCE 3

static int
keys_traverse(ShapeKeys *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ids);
    Py_VISIT(self->byte_ids);
    Py_VISIT(self->kind_of_type);
    Py_VISIT(self->kind);
    Py_VISIT(self->tensor);
    Py_VISIT(self->parameter);
    Py_VISIT(self->dtype_attr);
    Py_VISIT(self->shape_attr);
    return 0;
}

static int
keys_clear(ShapeKeys *self)
{
    Py_CLEAR(self->ids);
    Py_CLEAR(self->byte_ids);
    Py_CLEAR(self->kind_of_type);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->tensor);
    Py_CLEAR(self->parameter);
    Py_CLEAR(self->dtype_attr);
    Py_CLEAR(self->shape_attr);
    return 0;
}

static void
keys_dealloc(ShapeKeys *self)
{
    PyObject_GC_UnTrack(self);
    keys_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static long
type_kind(ShapeKeys *self, PyObject *cls)
{
    PyObject *kind = PyDict_GetItemWithError(self->kind_of_type, cls);
    if (kind != NULL)
        return PyLong_AsLong(kind);
    if (PyErr_Occurred())
        return -1;
    kind = PyObject_CallOneArg(self->kind, cls);
    if (kind == NULL)
        return -1;
    long result = PyLong_AsLong(kind);
    Py_DECREF(kind);
    return result;
}

/* An attribute of a plain tensor or parameter: its getset descriptor's getter when torch.Tensor
   resolves the name to one (what a.shape runs, without the attribute lookup), else getattr. */
static PyObject *
tensor_attr(PyObject *tensor, PyObject *descr, PyObject *name)
{
    if (descr != NULL && descr != Py_None) {
        descrgetfunc get = Py_TYPE(descr)->tp_descr_get;
        if (get != NULL)
            return get(descr, tensor, (PyObject *)Py_TYPE(tensor));
    }
    return PyObject_GetAttr(tensor, name);
}

/* The packed key: a byte string the hot path builds on the stack, then one bytes object. */
typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char inline_data[512];
} Packed;

static int
pack(Packed *p, const void *bytes, Py_ssize_t n)
{
    if (p->len + n > p->cap) {
        Py_ssize_t cap = (p->len + n) * 2;
        char *grown = PyMem_Malloc(cap);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(grown, p->data, p->len);
        if (p->data != p->inline_data)
            PyMem_Free(p->data);
        p->data = grown;
        p->cap = cap;
    }
    memcpy(p->data + p->len, bytes, n);
    p->len += n;
    return 0;
}

/* One tensor: 'T', its dtype object's address (dtypes are immortal singletons), its rank, its
   sizes. With ``fast`` (a plain Tensor or Parameter) through the getset descriptors. */
static int
pack_tensor(ShapeKeys *self, Packed *p, PyObject *tensor, int fast)
{
    PyObject *dtype = fast ? tensor_attr(tensor, self->dtype_attr, str_dtype)
                           : PyObject_GetAttr(tensor, str_dtype);
    if (dtype == NULL)
        return -1;
    PyObject *shape = fast ? tensor_attr(tensor, self->shape_attr, str_shape)
                           : PyObject_GetAttr(tensor, str_shape);
    if (shape == NULL) {
        Py_DECREF(dtype);
        return -1;
    }
    int failed = -1;
    if (!PyTuple_Check(shape)) {
        PyErr_SetString(PyExc_TypeError, "ShapeKeys: a tensor's shape is not a tuple");
        goto done;
    }
    char tag = 'T';
    void *address = dtype;
    long long rank = PyTuple_GET_SIZE(shape);
    if (pack(p, &tag, 1) < 0 || pack(p, &address, sizeof address) < 0 ||
        pack(p, &rank, sizeof rank) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < rank; i++) {
        long long size = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
        if ((size == -1 && PyErr_Occurred()) || pack(p, &size, sizeof size) < 0)
            goto done;
    }
    failed = 0;
done:
    Py_DECREF(dtype);
    Py_DECREF(shape);
    return failed;
}

/* Append a tensor's dtype and shape to ``key`` (the structured key, made on a miss only). */
static int
append_tensor(PyObject *key, PyObject *tensor)
{
    PyObject *dtype = PyObject_GetAttr(tensor, str_dtype);
    if (dtype == NULL)
        return -1;
    int failed = PyList_Append(key, dtype);
    Py_DECREF(dtype);
    if (failed < 0)
        return -1;
    PyObject *shape = PyObject_GetAttr(tensor, str_shape);
    if (shape == NULL)
        return -1;
    failed = PyList_Append(key, shape);
    Py_DECREF(shape);
    return failed;
}

/* A list argument's structured key: a tuple of (dtype, shape) for each tensor in it; packed:
   'L', each tensor, 'E'. */
static PyObject *
sequence_key(ShapeKeys *self, PyObject *seq, Packed *p)
{
    PyObject *items = PySequence_Fast(seq, "not a sequence");
    if (items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    PyObject *pairs = p == NULL ? PyList_New(0) : NULL, *pair = NULL, *result = NULL;
    if (p == NULL && pairs == NULL)
        goto done;
    if (p != NULL && pack(p, "L", 1) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(items, i);
        int is_tensor = PyObject_IsInstance(t, self->tensor);
        if (is_tensor < 0)
            goto done;
        if (!is_tensor)
            continue;
        if (p != NULL) {
            if (pack_tensor(self, p, t, 0) < 0)
                goto done;
            continue;
        }
        pair = PyList_New(0);
        if (pair == NULL || append_tensor(pair, t) < 0)
            goto done;
        PyObject *tuple = PyList_AsTuple(pair);
        Py_CLEAR(pair);
        if (tuple == NULL)
            goto done;
        int failed = PyList_Append(pairs, tuple);
        Py_DECREF(tuple);
        if (failed < 0)
            goto done;
    }
    if (p != NULL) {
        if (pack(p, "E", 1) == 0) {
            result = Py_None;
            Py_INCREF(result);
        }
    }
    else {
        result = PyList_AsTuple(pairs);
    }
done:
    Py_DECREF(items);
    Py_XDECREF(pairs);
    Py_XDECREF(pair);
    return result;
}

/* The key of an op's positional arguments: packed into ``p`` when it is not NULL (the hot
   path), else structured, the Python twin's key (a new tuple). */
static PyObject *
args_key(ShapeKeys *self, PyObject *items, Packed *p)
{
    PyObject *key = p == NULL ? PyList_New(0) : NULL, *result = NULL;
    if (p == NULL && key == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_Fast_GET_ITEM(items, i);
        PyObject *cls = (PyObject *)Py_TYPE(a);
        int plain = cls == self->tensor || cls == self->parameter;   /* most arguments */
        long kind = plain ? KIND_TENSOR : type_kind(self, cls);
        if (kind < 0)
            goto done;
        if (kind == KIND_TENSOR) {
            if (p != NULL ? pack_tensor(self, p, a, plain) : append_tensor(key, a))
                goto done;
        }
        else if (kind == KIND_SEQUENCE) {
            Py_ssize_t size = PyObject_Length(a);
            if (size < 0)
                goto done;
            if (size == 0)
                continue;
            PyObject *first = PySequence_GetItem(a, 0);
            if (first == NULL)
                goto done;
            long first_kind = type_kind(self, (PyObject *)Py_TYPE(first));
            Py_DECREF(first);
            if (first_kind < 0)
                goto done;
            if (first_kind != KIND_TENSOR)
                continue;
            PyObject *inner = sequence_key(self, a, p);
            if (inner == NULL)
                goto done;
            int failed = p != NULL ? 0 : PyList_Append(key, inner);
            Py_DECREF(inner);
            if (failed < 0)
                goto done;
        }
    }
    if (p != NULL) {
        result = Py_None;
        Py_INCREF(result);
    }
    else {
        result = PyList_AsTuple(key);
    }
done:
    Py_XDECREF(key);
    return result;
}

static PyObject *
keys_id_of(ShapeKeys *self, PyObject *ops_args)
{
    if (self->ids == NULL || !PyDict_Check(self->ids) || self->byte_ids == NULL ||
        !PyDict_Check(self->byte_ids) || self->kind_of_type == NULL ||
        !PyDict_Check(self->kind_of_type) || self->kind == NULL || self->tensor == NULL ||
        self->parameter == NULL) {
        PyErr_SetString(PyExc_TypeError, "ShapeKeys: its tables are not set up");
        return NULL;
    }
    PyObject *items = PySequence_Fast(ops_args, "ShapeKeys: the op's args are not a sequence");
    if (items == NULL)
        return NULL;
    Packed p = {.len = 0, .cap = sizeof p.inline_data};
    p.data = p.inline_data;
    PyObject *packed = NULL, *sid = NULL, *done = args_key(self, items, &p);
    if (done == NULL)
        goto done;
    Py_DECREF(done);
    packed = PyBytes_FromStringAndSize(p.data, p.len);
    if (packed == NULL)
        goto done;
    sid = PyDict_GetItemWithError(self->byte_ids, packed);
    if (sid != NULL) {
        Py_INCREF(sid);
        goto done;
    }
    if (PyErr_Occurred())
        goto done;
    /* a new signature: its structured key, to the subclass to format and intern */
    PyObject *key = args_key(self, items, NULL);
    if (key == NULL)
        goto done;
    sid = PyObject_CallMethodOneArg((PyObject *)self, str_new, key);
    Py_DECREF(key);
    if (sid != NULL && PyDict_SetItem(self->byte_ids, packed, sid) < 0)
        Py_CLEAR(sid);
done:
    if (p.data != p.inline_data)
        PyMem_Free(p.data);
    Py_DECREF(items);
    Py_XDECREF(packed);
    return sid;
}

static PyMethodDef keys_methods[] = {
    {"id_of", (PyCFunction)keys_id_of, METH_O,
     "The signature id of an op's positional arguments (their tensors' dtypes and shapes)."},
    {NULL},
};

static PyMemberDef keys_members[] = {
    {"_ids", T_OBJECT, offsetof(ShapeKeys, ids), 0, NULL},
    {"_byte_ids", T_OBJECT, offsetof(ShapeKeys, byte_ids), 0, NULL},
    {"_dtype_attr", T_OBJECT, offsetof(ShapeKeys, dtype_attr), 0, NULL},
    {"_shape_attr", T_OBJECT, offsetof(ShapeKeys, shape_attr), 0, NULL},
    {"_kind_of_type", T_OBJECT, offsetof(ShapeKeys, kind_of_type), 0, NULL},
    {"_kind", T_OBJECT, offsetof(ShapeKeys, kind), 0, NULL},
    {"_tensor", T_OBJECT, offsetof(ShapeKeys, tensor), 0, NULL},
    {"_parameter", T_OBJECT, offsetof(ShapeKeys, parameter), 0, NULL},
    {NULL},
};

PyTypeObject ShapeKeysType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer._hotpath.ShapeKeys",
    .tp_basicsize = sizeof(ShapeKeys),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ShapeSignatures' key in C (tracer/shapes.py has its Python twin).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)keys_traverse,
    .tp_clear = (inquiry)keys_clear,
    .tp_dealloc = (destructor)keys_dealloc,
    .tp_methods = keys_methods,
    .tp_members = keys_members,
};
