/* The tracer._hotpath module: its two types and the names they look up (hotpath.h). */
#include "hotpath.h"

PyObject *str_classify, *str_new_node, *str_sid, *str_root, *str_dtype, *str_shape,
    *str_id_of_new;

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracer._hotpath",
    .m_doc = "The recorder's stack capture and shape keys in C (see tracer/stacks.py, shapes.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__hotpath(void)
{
    if ((str_classify = PyUnicode_InternFromString("classify")) == NULL ||
        (str_new_node = PyUnicode_InternFromString("_new_node")) == NULL ||
        (str_sid = PyUnicode_InternFromString("_sid")) == NULL ||
        (str_root = PyUnicode_InternFromString("_root")) == NULL ||
        (str_dtype = PyUnicode_InternFromString("dtype")) == NULL ||
        (str_shape = PyUnicode_InternFromString("shape")) == NULL ||
        (str_id_of_new = PyUnicode_InternFromString("_id_of_new")) == NULL)
        return NULL;
    if (PyType_Ready(&StackWalkType) < 0 || PyType_Ready(&ShapeKeysType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&StackWalkType);
    Py_INCREF(&ShapeKeysType);
    if (PyModule_AddObject(module, "StackWalk", (PyObject *)&StackWalkType) < 0 ||
        PyModule_AddObject(module, "ShapeKeys", (PyObject *)&ShapeKeysType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
