/* The tracer.recorder._hotpath module: its types and the names they look up (hotpath.h). */
#include "hotpath.h"

PyObject *str_classify, *str_new_node, *str_sid, *str_root, *str_dtype, *str_shape,
    *str_id_of_new, *str_applied_at, *str_phase_hint, *str_current,
    *str_sequence_nr, *str_thread, *str_flusher, *str_flush, *str_recorder_failed;

static PyMethodDef hotpath_functions[] = {
    {"now", hot_now, METH_NOARGS, "The C path's clock: time.perf_counter_ns's, in ns."},
    {NULL},
};

static int
intern(PyObject **name, const char *text)
{
    return (*name = PyUnicode_InternFromString(text)) == NULL ? -1 : 0;
}

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracer.recorder._hotpath",
    .m_doc = "The recorder's hot path in C: on_op's common path, the stack capture and the "
             "shape keys (see tracer/recorder/op_path.py, attribution/stacks.py, "
             "attribution/shapes.py; docs/recorder.md).",
    .m_size = -1,
    .m_methods = hotpath_functions,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    if (intern(&str_classify, "classify") < 0 || intern(&str_new_node, "_new_node") < 0 ||
        intern(&str_sid, "_sid") < 0 || intern(&str_root, "_root") < 0 ||
        intern(&str_dtype, "dtype") < 0 || intern(&str_shape, "shape") < 0 ||
        intern(&str_id_of_new, "_id_of_new") < 0 || intern(&str_applied_at, "applied_at") < 0 ||
        intern(&str_phase_hint, "phase_hint") < 0 || intern(&str_current, "current") < 0 ||
        intern(&str_sequence_nr, "_sequence_nr") < 0 || intern(&str_thread, "thread_number") < 0 ||
        intern(&str_flusher, "_flusher") < 0 || intern(&str_flush, "flush") < 0 ||
        intern(&str_recorder_failed, "_recorder_failed") < 0)
        return NULL;
    if (PyType_Ready(&StackWalkType) < 0 || PyType_Ready(&ShapeKeysType) < 0 ||
        PyType_Ready(&SessionStateType) < 0 || PyType_Ready(&OpDispatchType) < 0 ||
        storage_table_ready() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "StackWalk", (PyObject *)&StackWalkType) < 0 ||
        PyModule_AddObjectRef(module, "ShapeKeys", (PyObject *)&ShapeKeysType) < 0 ||
        PyModule_AddObjectRef(module, "SessionState", (PyObject *)&SessionStateType) < 0 ||
        PyModule_AddObjectRef(module, "OpDispatch", (PyObject *)&OpDispatchType) < 0 ||
        PyModule_AddObjectRef(module, "StorageTable", (PyObject *)&StorageTableType) < 0 ||
        add_onop_constants(module) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
