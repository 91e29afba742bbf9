/* ShapeKeys: ShapeSignatures.id_of in C; tracer/recorder/attribution/shapes.py's _PyShapeKeys is
 * its twin. */
#include "hotpath.h"

typedef struct {
    PyObject_HEAD
    PyObject *byte_ids;       /* packed key -> signature id (a new one: the Python twin's) */
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

/* A list argument: 'L', each tensor in it, 'E'. */
static int
pack_sequence(ShapeKeys *self, Packed *p, PyObject *seq)
{
    PyObject *items = PySequence_Fast(seq, "not a sequence");
    if (items == NULL)
        return -1;
    int failed = pack(p, "L", 1);
    for (Py_ssize_t i = 0; !failed && i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *t = PySequence_Fast_GET_ITEM(items, i);
        int is_tensor = PyObject_IsInstance(t, self->tensor);
        failed = is_tensor < 0 ? -1 : is_tensor ? pack_tensor(self, p, t, 0) : 0;
    }
    Py_DECREF(items);
    return failed ? -1 : pack(p, "E", 1);
}

/* The packed key of an op's positional arguments: what the Python twin's key holds (its
   tensors' dtypes and sizes, a list argument's bracketed), as bytes. */
static int
pack_args(ShapeKeys *self, Packed *p, PyObject *items)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PySequence_Fast_GET_ITEM(items, i);
        PyObject *cls = (PyObject *)Py_TYPE(a);
        int plain = cls == self->tensor || cls == self->parameter;   /* most arguments */
        long kind = plain ? KIND_TENSOR : type_kind(self, cls);
        if (kind < 0)
            return -1;
        if (kind == KIND_TENSOR) {
            if (pack_tensor(self, p, a, plain) < 0)
                return -1;
        }
        else if (kind == KIND_SEQUENCE) {
            Py_ssize_t size = PyObject_Length(a);
            if (size < 0)
                return -1;
            if (size == 0)
                continue;
            PyObject *first = PySequence_GetItem(a, 0);
            if (first == NULL)
                return -1;
            long first_kind = type_kind(self, (PyObject *)Py_TYPE(first));
            Py_DECREF(first);
            if (first_kind < 0)
                return -1;
            if (first_kind == KIND_TENSOR && pack_sequence(self, p, a) < 0)
                return -1;
        }
    }
    return 0;
}

static PyObject *
keys_id_of(ShapeKeys *self, PyObject *ops_args)
{
    if (self->byte_ids == NULL || !PyDict_Check(self->byte_ids) || self->kind_of_type == NULL ||
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
    PyObject *packed = NULL, *sid = NULL;
    if (pack_args(self, &p, items) < 0)
        goto done;
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
    /* a key not seen yet: the Python twin's id of these arguments (formatted once) */
    sid = PyObject_CallMethodOneArg((PyObject *)self, str_id_of_new, ops_args);
    if (sid != NULL && PyDict_SetItem(self->byte_ids, packed, sid) < 0)
        Py_CLEAR(sid);
done:
    if (p.data != p.inline_data)
        PyMem_Free(p.data);
    Py_DECREF(items);
    Py_XDECREF(packed);
    return sid;
}

/* id_of for the C on_op (onop.c), which checked the type */
PyObject *
shape_keys_id_of(PyObject *self, PyObject *ops_args)
{
    return keys_id_of((ShapeKeys *)self, ops_args);
}

static PyMethodDef keys_methods[] = {
    {"id_of", (PyCFunction)keys_id_of, METH_O,
     "The signature id of an op's positional arguments (their tensors' dtypes and shapes)."},
    {NULL},
};

static PyMemberDef keys_members[] = {
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
    .tp_name = "tracer.recorder._hotpath.ShapeKeys",
    .tp_basicsize = sizeof(ShapeKeys),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "ShapeSignatures' key in C (tracer/recorder/attribution/shapes.py has its Python "
              "twin).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)keys_traverse,
    .tp_clear = (inquiry)keys_clear,
    .tp_dealloc = (destructor)keys_dealloc,
    .tp_methods = keys_methods,
    .tp_members = keys_members,
};
