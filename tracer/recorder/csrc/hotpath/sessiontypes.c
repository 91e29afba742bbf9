/* SessionState's and OpDispatch's types (onop.c has the path they run): the members through
 * which Python reads and sets the fields of a Session that C reads, the callable torch calls as
 * the recording mode's __torch_dispatch__, and the constants C shares with Python. */
#include "hotpath.h"

/* ------------------------------------------------------------------ SessionState */
static int
state_traverse(SessionState *s, visitproc visit, void *arg)
{
    Py_VISIT(s->specs);
    Py_VISIT(s->queue);
    Py_VISIT(s->push);
    Py_VISIT(s->threads);
    Py_VISIT(s->fwd_of_node);
    Py_VISIT(s->fwd_prev);
    Py_VISIT(s->funcol);
    Py_VISIT(s->futures);
    Py_VISIT(s->modules);
    Py_VISIT(s->annotations);
    Py_VISIT(s->stacks);
    Py_VISIT(s->signatures);
    Py_VISIT(s->rules);
    Py_VISIT(s->torch_state);
    Py_VISIT(s->memory_table);
    return map_traverse(&s->entries, visit, arg);
}

static int
state_clear(SessionState *s)
{
    Py_CLEAR(s->specs);
    Py_CLEAR(s->queue);
    Py_CLEAR(s->push);
    Py_CLEAR(s->threads);
    Py_CLEAR(s->fwd_of_node);
    Py_CLEAR(s->fwd_prev);
    Py_CLEAR(s->funcol);
    Py_CLEAR(s->futures);
    Py_CLEAR(s->modules);
    Py_CLEAR(s->annotations);
    Py_CLEAR(s->stacks);
    Py_CLEAR(s->signatures);
    Py_CLEAR(s->rules);
    Py_CLEAR(s->torch_state);
    Py_CLEAR(s->memory_table);
    map_clear(&s->entries);
    return 0;
}

static void
state_dealloc(SessionState *s)
{
    PyObject_GC_UnTrack(s);
    state_clear(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

#define FIELD(name, type, field) {name, type, offsetof(SessionState, field), 0, NULL}
static PyMemberDef state_members[] = {
    FIELD("passthrough", T_BOOL, passthrough),
    FIELD("device_wanted", T_BOOL, device_wanted),
    FIELD("pg_seen", T_BOOL, pg_seen),
    FIELD("_record_stacks", T_BOOL, record_stacks),
    FIELD("_record_shapes", T_BOOL, record_shapes),
    FIELD("open_ranges", T_INT, open_ranges),
    FIELD("recompute", T_INT, recompute),
    FIELD("in_optimizer", T_INT, in_optimizer),
    FIELD("step_index", T_LONGLONG, step_index),
    FIELD("_last_seq", T_LONGLONG, last_seq),
    FIELD("_last_event_ns", T_LONGLONG, last_event_ns),
    FIELD("_specs", T_OBJECT_EX, specs),
    FIELD("_queue", T_OBJECT_EX, queue),
    FIELD("push", T_OBJECT_EX, push),
    FIELD("_threads", T_OBJECT_EX, threads),
    FIELD("fwd_of_node", T_OBJECT_EX, fwd_of_node),
    FIELD("fwd_prev", T_OBJECT_EX, fwd_prev),
    FIELD("_funcol", T_OBJECT_EX, funcol),
    FIELD("_futures", T_OBJECT_EX, futures),
    FIELD("_modules", T_OBJECT_EX, modules),
    FIELD("_annotations", T_OBJECT_EX, annotations),
    FIELD("_stacks", T_OBJECT_EX, stacks),
    FIELD("_signatures", T_OBJECT_EX, signatures),
    FIELD("_rules", T_OBJECT_EX, rules),
    FIELD("_torch_state", T_OBJECT_EX, torch_state),
    FIELD("memory_table", T_OBJECT, memory_table),
    {NULL},
};

/* Whether on_op's C path can run for this session: a test holds it true for an ordinary
   session, since a field the Python side stopped setting (a rename) silently sends every op
   to the Python twin and only the wall time would show it. */
static PyObject *
state_c_ready(SessionState *s, void *closure)
{
    return PyBool_FromLong(session_is_ready(s));
}

static PyGetSetDef state_getset[] = {
    {"_c_ready", (getter)state_c_ready, NULL, "on_op's C path can run", NULL},
    {NULL},
};

PyTypeObject SessionStateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.recorder._hotpath.SessionState",
    .tp_basicsize = sizeof(SessionState),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of Session that on_op's C path reads (tracer/recorder/op_path.py, "
              "docs/recorder.md).",
    .tp_new = PyType_GenericNew,
    .tp_traverse = (traverseproc)state_traverse,
    .tp_clear = (inquiry)state_clear,
    .tp_dealloc = (destructor)state_dealloc,
    .tp_members = state_members,
    .tp_getset = state_getset,
};

/* The error set came from the recorder's own work: the session records nothing more (its
   Python side says why, once: Session._recorder_failed), and the error is cleared; 0. An error
   that is not an Exception (KeyboardInterrupt...) is the user's: it stays set; -1. */
int
session_failed(SessionState *s)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    s->passthrough = 1;
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *exc = PyErr_GetRaisedException();
#else
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);
    PyErr_NormalizeException(&type, &exc, &tb);
    if (exc != NULL && tb != NULL)
        PyException_SetTraceback(exc, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
#endif
    PyObject *said = PyObject_CallMethodOneArg((PyObject *)s, str_recorder_failed,
                                               exc != NULL ? exc : Py_None);
    Py_XDECREF(exc);
    if (said == NULL)
        PyErr_Clear();          /* passthrough already: nothing more to lose */
    Py_XDECREF(said);
    return 0;
}

/* ------------------------------------------------------------------ OpDispatch */
typedef struct {
    PyObject_HEAD
    PyObject *mode;           /* __self__: torch checks it is the mode */
    PyObject *session;        /* a SessionState */
    PyObject *fallback;       /* the mode's Python __torch_dispatch__, bound */
    vectorcallfunc vectorcall;
} OpDispatch;

static PyObject *
dispatch_call(OpDispatch *self, PyObject *const *argv, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    if (self->session == NULL || self->fallback == NULL) {    /* cleared by the collector */
        PyErr_SetString(PyExc_RuntimeError, "OpDispatch: called after it was cleared");
        return NULL;
    }
    /* torch calls (func, types, args[, kwargs]); () types: plain tensors */
    if (kwnames == NULL && (n == 3 || n == 4) && PyTuple_Check(argv[1]) &&
        PyTuple_GET_SIZE(argv[1]) == 0 && PyTuple_Check(argv[2])) {
        PyObject *kwargs = n == 4 ? argv[3] : NULL;
        if (kwargs == Py_None || (kwargs != NULL && PyDict_Check(kwargs) &&
                                  PyDict_GET_SIZE(kwargs) == 0))
            kwargs = NULL;
        if (kwargs == NULL || PyDict_Check(kwargs)) {
            int handled;
            PyObject *out = session_on_op((SessionState *)self->session, argv[0], argv[2],
                                          kwargs, &handled);
            if (handled)
                return out;
        }
    }
    return PyObject_Vectorcall(self->fallback, argv, nargsf, kwnames);
}

static PyObject *
dispatch_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *mode, *session, *fallback;
    if (!PyArg_ParseTuple(args, "OO!O:OpDispatch", &mode, &SessionStateType, &session,
                          &fallback))
        return NULL;
    if (!PyCallable_Check(fallback)) {
        PyErr_SetString(PyExc_TypeError, "OpDispatch: the fallback is not callable");
        return NULL;
    }
    OpDispatch *self = (OpDispatch *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->mode = Py_NewRef(mode);
    self->session = Py_NewRef(session);
    self->fallback = Py_NewRef(fallback);
    self->vectorcall = (vectorcallfunc)dispatch_call;
    return (PyObject *)self;
}

static int
dispatch_traverse(OpDispatch *self, visitproc visit, void *arg)
{
    Py_VISIT(self->mode);
    Py_VISIT(self->session);
    Py_VISIT(self->fallback);
    return 0;
}

static int
dispatch_clear(OpDispatch *self)
{
    Py_CLEAR(self->mode);
    Py_CLEAR(self->session);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
dispatch_dealloc(OpDispatch *self)
{
    PyObject_GC_UnTrack(self);
    dispatch_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef dispatch_members[] = {
    {"__self__", T_OBJECT, offsetof(OpDispatch, mode), READONLY, NULL},
    {"session", T_OBJECT, offsetof(OpDispatch, session), READONLY, NULL},
    {"fallback", T_OBJECT, offsetof(OpDispatch, fallback), READONLY, NULL},
    {NULL},
};

PyTypeObject OpDispatchType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tracer.recorder._hotpath.OpDispatch",
    .tp_basicsize = sizeof(OpDispatch),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "OpDispatch(mode, session, fallback): the recording mode's __torch_dispatch__ "
              "with on_op's common path in C (tracer/recorder/hotpath/_mode.py).",
    .tp_new = dispatch_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(OpDispatch, vectorcall),
    .tp_traverse = (traverseproc)dispatch_traverse,
    .tp_clear = (inquiry)dispatch_clear,
    .tp_dealloc = (destructor)dispatch_dealloc,
    .tp_members = dispatch_members,
};

PyObject *
hot_now(PyObject *module, PyObject *unused)
{
    return PyLong_FromLongLong(now_ns());
}

int
add_onop_constants(PyObject *module)
{
    return PyModule_AddIntConstant(module, "PHASE_OTHER", PHASE_OTHER) < 0 ||
        PyModule_AddIntConstant(module, "PHASE_FORWARD", PHASE_FORWARD) < 0 ||
        PyModule_AddIntConstant(module, "PHASE_BACKWARD", PHASE_BACKWARD) < 0 ||
        PyModule_AddIntConstant(module, "PHASE_RECOMPUTE", PHASE_RECOMPUTE) < 0 ||
        PyModule_AddIntConstant(module, "PHASE_GRAD_SYNC", PHASE_GRAD_SYNC) < 0 ||
        PyModule_AddIntConstant(module, "PHASE_OPTIMIZER", PHASE_OPTIMIZER) < 0 ||
        PyModule_AddIntConstant(module, "MAX_QUEUE", MAX_QUEUE) < 0 ||
        PyModule_AddIntConstant(module, "MAX_NODES", MAX_NODES) < 0 ||
        PyModule_AddIntConstant(module, "ROW_FIELDS", ROW_FIELDS) < 0 ? -1 : 0;
}
