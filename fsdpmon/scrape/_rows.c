/* The C half of frozen.maker: a frozen dataclass's instance built from an accumulator and the
 * values computed for it, without its generated __init__ and without a Python frame and a
 * keyword dict per object (6k rows a refresh of a large job, on the path no second process
 * shares). Does what frozen.maker's ``make`` does, step for step; tests/test_snapshot.py builds
 * every class both ways and compares.
 *
 * make_row(cls, defaults, filed=None, /, **values) -> an instance of cls whose __dict__ is
 * ``filed`` itself (a dict: taken over, not copied) or a new dict, with each field of
 * ``defaults`` it lacks set to its default, then ``values`` set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *empty_tuple;

static PyObject *make_row(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    (void)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2 || nargs > 3 || !PyType_Check(args[0]) || !PyDict_CheckExact(args[1]) ||
        (nargs == 3 && args[2] != Py_None && !PyDict_CheckExact(args[2]))) {
        PyErr_SetString(PyExc_TypeError, "make_row(cls, defaults: dict, filed: dict | None = None, /, **values)");
        return NULL;
    }
    PyObject *defaults = args[1], *filed = nargs == 3 ? args[2] : Py_None, *slots;
    PyObject *row = PyBaseObject_Type.tp_new((PyTypeObject *)args[0], empty_tuple, NULL);
    if (row == NULL)
        return NULL;
    if (filed == Py_None) {
        slots = PyDict_Copy(defaults);
    } else {
        slots = Py_NewRef(filed);
        if (PyDict_Merge(slots, defaults, 0)) /* the defaults of the fields it lacks */
            goto fail;
    }
    if (slots == NULL)
        goto fail;
    for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++)
        if (PyDict_SetItem(slots, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]))
            goto fail;
    if (PyObject_GenericSetDict(row, slots, NULL))
        goto fail;
    Py_DECREF(slots);
    return row;
fail:
    Py_XDECREF(slots);
    Py_DECREF(row);
    return NULL;
}

static PyMethodDef methods[] = {
    {"make_row", (PyCFunction)(void (*)(void))make_row, METH_FASTCALL | METH_KEYWORDS,
     "make_row(cls, defaults, filed=None, /, **values): frozen.maker's make (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, 0, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__rows(void) {
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
