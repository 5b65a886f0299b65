/* The C half of rows.maker: a frozen row dataclass's instance built from its accumulator and
 * the values computed for it, without its generated __init__ and without a Python frame and a
 * keyword dict per row (6k rows a refresh of a large job, on the path no second process
 * shares). Does what rows.maker's ``make`` does, step for step; tests/test_snapshot.py builds
 * every row class both ways and compares.
 *
 * make_row(cls, defaults, extras, filed=None, /, **values) -> an instance of cls whose __dict__
 * is ``defaults``, updated by the entries of ``filed`` that are fields (``len(defaults)`` of
 * them in all), then by ``values``. ``extras`` is a one-item list: the entries of the last
 * ``filed`` that were no field, dropped first (and replaced when others turn up).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *empty_tuple;

/* Drops the entries of ``slots`` that are no field: the last row's extras first, then (when
 * there are others) the new set of them, kept in extras[0]. */
static int drop_extras(PyObject *slots, PyObject *defaults, PyObject *extras, Py_ssize_t count) {
    PyObject *last = PyList_GET_ITEM(extras, 0);
    if (!PyTuple_Check(last)) {
        PyErr_SetString(PyExc_TypeError, "extras[0] must be a tuple");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(last); i++) /* slots.pop(key, None) */
        if (PyDict_DelItem(slots, PyTuple_GET_ITEM(last, i)) < 0) {
            if (!PyErr_ExceptionMatches(PyExc_KeyError))
                return -1;
            PyErr_Clear();
        }
    if (PyDict_GET_SIZE(slots) == count)
        return 0;
    PyObject *found = PyList_New(0), *key, *value, *fresh;
    if (found == NULL)
        return -1;
    for (Py_ssize_t at = 0; PyDict_Next(slots, &at, &key, &value);) {
        int field = PyDict_Contains(defaults, key);
        if (field < 0 || (!field && PyList_Append(found, key))) {
            Py_DECREF(found);
            return -1;
        }
    }
    fresh = PyList_AsTuple(found);
    Py_DECREF(found);
    if (fresh == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fresh); i++)
        if (PyDict_DelItem(slots, PyTuple_GET_ITEM(fresh, i)) < 0) {
            Py_DECREF(fresh);
            return -1;
        }
    return PyList_SetItem(extras, 0, fresh); /* steals it */
}

static PyObject *make_row(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    (void)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 3 || nargs > 4 || !PyType_Check(args[0]) || !PyDict_CheckExact(args[1]) ||
        !PyList_CheckExact(args[2]) || PyList_GET_SIZE(args[2]) != 1) {
        PyErr_SetString(PyExc_TypeError, "make_row(cls, defaults: dict, extras: [tuple], filed=None, /, **values)");
        return NULL;
    }
    PyObject *defaults = args[1], *extras = args[2], *filed = nargs == 4 ? args[3] : Py_None;
    Py_ssize_t count = PyDict_GET_SIZE(defaults);
    PyObject *row = PyBaseObject_Type.tp_new((PyTypeObject *)args[0], empty_tuple, NULL), *slots;
    if (row == NULL)
        return NULL;
    if ((slots = PyObject_GenericGetDict(row, NULL)) == NULL || PyDict_Update(slots, defaults))
        goto fail;
    int any = filed == Py_None ? 0 : PyObject_IsTrue(filed); /* `if filed:` */
    if (any < 0 || (any && PyDict_Update(slots, filed)))
        goto fail;
    if (any && PyDict_GET_SIZE(slots) != count && drop_extras(slots, defaults, extras, count))
        goto fail;
    for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++)
        if (PyDict_SetItem(slots, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]))
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
     "make_row(cls, defaults, extras, filed=None, /, **values): rows.maker's make (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_rows", NULL, 0, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__rows(void) {
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
