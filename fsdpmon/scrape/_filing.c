/* The C half of filing.file_result: the samples a layout does not store (info series, events,
 * processes, hosts, the tiers a cadence carries: ~24k a refresh of a large job) filed into a
 * refresh's accumulators, and the rows the fused path stores figures in. Each function does
 * what its Python twin in filing.py does, step for step and with the same Python operations
 * (int() of a label, `or`, dict stores), so that results and errors are the same;
 * tests/test_filing_c.py files every case it has both ways and compares.
 *
 * setup(kinds, names, add_host, add_gpu_event): once, from filing.py: the name → (kind, field)
 *     table, the catalog names the loop tests for, and the Python helpers it leaves the rare
 *     samples to (a host's, a GPU's XID count or active clock events).
 * row_of(acc, kind, labels, target) -> the row of a stored figure   (filing.row_of; the rank and
 *     GPU entries it finds are filing._rank_entry's and _gpu_entry's)
 * file_samples(acc, samples, target, train, exporter, node) -> (train, exporter, node), or None
 *     (nothing filed) when a sample is not a (str, dict, value) tuple: file_result's loop.
 */
#include "_filing_rows.h" /* Python.h, the names, the helpers and the rows */

/* One sample of file_result's loop. */
static int file_one(Parts *p, PyObject *sample, PyObject *target, PyObject *proc_memo,
                    PyObject **node, PyObject **memo_node, int *train, int *exporter) {
    PyObject *name = PyTuple_GET_ITEM(sample, 0), *labels = PyTuple_GET_ITEM(sample, 1),
             *value = PyTuple_GET_ITEM(sample, 2);
    PyObject *entry = PyDict_GetItemWithError(kinds, name), *key_field, *id, *row;
    if (entry == NULL && PyErr_Occurred())
        return -1;
    long kind = entry == NULL ? OTHER : PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    if (kind == OTHER)
        return 0;
    key_field = PyTuple_GET_ITEM(entry, 1);
    if (kind == JOB) {
        *train = 1;
        return store(p->job, key_field, value);
    }
    if (kind == HOST) {
        PyObject *named = get(labels, s_node, NULL);
        int has = truthy(named);
        if (has < 0 || (named == NULL && PyErr_Occurred()))
            return -1;
        if (has)
            Py_SETREF(*node, Py_NewRef(named));
        PyObject *done = PyObject_CallFunctionObjArgs(add_host, p->acc, name, key_field, labels,
                                                      value, *node, NULL);
        Py_XDECREF(done);
        *exporter = 1;
        return done == NULL ? -1 : 0;
    }
    if ((id = PyLong_FromVoidPtr(labels)) == NULL)
        return -1;
    int failed = 0;
    if (kind <= EXIT) {
        *train = 1;
        row = memo_row(p, p->rank_memo, id, labels, target, 0, 0);
        if (row == NULL) {
            failed = 1;
        } else if (row != Py_None) {
            if (kind == INFO) {
                failed = add_info(p, row, labels);
            } else if (kind == EXIT) {
                int is = PyObject_RichCompareBool(value, one_float, Py_EQ);
                failed = is < 0 || (is && store_label(row, key_field, labels, s_how));
            } else {
                failed = store(row, key_field, value);
            }
        }
    } else if (kind == GPU || kind == EVENT) {
        row = memo_row(p, p->gpu_memo, id, labels, target, 1, kind == EVENT);
        if (row == NULL) {
            failed = 1;
        } else if (kind == EVENT) {
            failed = gpu_event(row, name, labels, value);
        } else if (!(failed = store(row, key_field, value))) {
            PyObject *named = get(labels, s_node, NULL);
            int has = truthy(named);
            failed = has < 0 || (named == NULL && PyErr_Occurred());
            if (has > 0)
                Py_SETREF(*node, Py_NewRef(named));
        }
        *exporter = 1;
    } else { /* PROC */
        int moved = PyObject_RichCompareBool(*node, *memo_node, Py_NE);
        if (moved < 0) {
            Py_DECREF(id);
            return -1;
        }
        if (moved) {
            PyDict_Clear(proc_memo);
            Py_SETREF(*memo_node, Py_NewRef(*node));
        }
        row = PyDict_GetItemWithError(proc_memo, id);
        if (row != NULL) {
            Py_INCREF(row);
        } else if (!PyErr_Occurred()) {
            PyObject *named = get(labels, s_node, NULL);
            int has = truthy(named);
            if (has >= 0 && !(named == NULL && PyErr_Occurred())) {
                row = process_row(p->procs, labels, has ? named : *node);
                if (row != NULL && PyDict_SetItem(proc_memo, id, row))
                    Py_CLEAR(row);
            }
        }
        failed = row == NULL || (row != Py_None && add_process(row, name, key_field, labels, value));
        *exporter = 1;
    }
    Py_DECREF(id);
    Py_XDECREF(row);
    return failed ? -1 : 0;
}

static PyObject *file_samples(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (kinds == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "setup() first");
        return NULL;
    }
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "file_samples(acc, samples, target, train, exporter, node)");
        return NULL;
    }
    PyObject *samples = PySequence_Fast(args[1], "samples must be a sequence");
    if (samples == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(samples);
    PyObject **items = PySequence_Fast_ITEMS(samples);
    for (Py_ssize_t i = 0; i < count; i++) { /* what the loop reads, checked before it files */
        PyObject *s = items[i];
        if (!PyTuple_Check(s) || PyTuple_GET_SIZE(s) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(s, 0)) ||
            !PyDict_Check(PyTuple_GET_ITEM(s, 1))) {
            Py_DECREF(samples);
            Py_RETURN_NONE;
        }
    }
    Parts p;
    int train = PyObject_IsTrue(args[3]), exporter = PyObject_IsTrue(args[4]);
    PyObject *out = NULL, *proc_memo = NULL, *node = Py_NewRef(args[5]), *memo_node = Py_NewRef(args[5]);
    if (train < 0 || exporter < 0 || parts_of(args[0], &p) || (proc_memo = PyDict_New()) == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < count; i++)
        if (file_one(&p, items[i], args[2], proc_memo, &node, &memo_node, &train, &exporter))
            goto done;
    out = Py_BuildValue("(OOO)", train ? Py_True : Py_False, exporter ? Py_True : Py_False, node);
done:
    Py_DECREF(samples);
    Py_XDECREF(proc_memo);
    Py_DECREF(node);
    Py_DECREF(memo_node);
    return out;
}

/* filing.row_of(acc, kind, labels, target): the row a stored figure's series fills. */
static PyObject *row_of(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 4 || !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "row_of(acc, kind, labels: dict, target)");
        return NULL;
    }
    if (kinds == NULL)
        return PyErr_SetString(PyExc_RuntimeError, "setup() first"), NULL;
    long kind = PyLong_AsLong(args[1]);
    if (kind == -1 && PyErr_Occurred())
        return NULL;
    Parts p;
    p.acc = args[0];
    if (kind != RANK && kind != GPU)
        return PyObject_GetAttr(p.acc, s_job);
    if (attribute(p.acc, s_memo_labels, &p.memo_labels) ||
        (kind == RANK ? attribute(p.acc, s_ranks, &p.ranks) || attribute(p.acc, s_rank_memo, &p.rank_memo)
                      : attribute(p.acc, s_gpus_attr, &p.gpus) || attribute(p.acc, s_gpu_memo, &p.gpu_memo)))
        return NULL;
    PyObject *id = PyLong_FromVoidPtr(args[2]), *row;
    if (id == NULL)
        return NULL;
    row = kind == RANK ? memo_row(&p, p.rank_memo, id, args[2], args[3], 0, 0)
                       : memo_row(&p, p.gpu_memo, id, args[2], args[3], 1, 1);
    Py_DECREF(id);
    return row;
}

/* setup(kinds, names, add_host, add_gpu_event); names: (the kinds' numbers RANK..OTHER, the
 * clock-event, ECC, process-info and process-state names, the rank, local-rank and job labels,
 * the GPU attributes, the process owner labels). */
static PyObject *setup(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    PyObject *numbers, *names, *attributes, *owner;
    if (nargs != 4 || !PyDict_Check(args[0]) || !PyTuple_Check(args[1]) ||
        !PyArg_ParseTuple(args[1], "OOOOOOOOOO", &numbers, &n_clock_event, &n_ecc,
                          &n_process_info, &n_process_state, &s_rank, &s_local_rank,
                          &s_job_label, &attributes, &owner)) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "setup(kinds, names, add_host, add_gpu_event)");
        return NULL;
    }
    names = Py_BuildValue("(iiiiiiiii)", RANK, INFO, EXIT, JOB, GPU, EVENT, PROC, HOST, OTHER);
    int same = names ? PyObject_RichCompareBool(numbers, names, Py_EQ) : -1;
    Py_XDECREF(names);
    if (same <= 0) {
        if (same == 0)
            PyErr_SetString(PyExc_ValueError, "the kinds are numbered otherwise than here");
        return NULL;
    }
    if (!PyTuple_Check(attributes) || !PyTuple_Check(owner)) {
        PyErr_SetString(PyExc_TypeError, "the GPU attributes and the owner labels are tuples");
        return NULL;
    }
    PyObject *name, *entry;
    for (Py_ssize_t at = 0; PyDict_Next(args[0], &at, &name, &entry);) { /* file_one trusts it */
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
            !PyLong_Check(PyTuple_GET_ITEM(entry, 0)) || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 1))) {
            PyErr_Format(PyExc_TypeError, "kinds[%R] is not a (kind, field) pair", name);
            return NULL;
        }
    }
    PyObject **kept[] = {&n_clock_event, &n_ecc, &n_process_info, &n_process_state, &s_rank,
                         &s_local_rank, &s_job_label, &attributes, &owner};
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        Py_INCREF(*kept[i]); /* kept for the life of the process, as filing.py's own are */
    gpu_attributes = attributes;
    process_owner = owner;
    kinds = Py_NewRef(args[0]);
    add_host = Py_NewRef(args[2]);
    add_gpu_event = Py_NewRef(args[3]);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"setup", (PyCFunction)(void (*)(void))setup, METH_FASTCALL, "setup(kinds, names, add_host, add_gpu_event)"},
    {"file_samples", (PyCFunction)(void (*)(void))file_samples, METH_FASTCALL,
     "file_samples(acc, samples, target, train, exporter, node) -> (train, exporter, node) or None"},
    {"row_of", (PyCFunction)(void (*)(void))row_of, METH_FASTCALL, "filing.row_of"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_filing", NULL, 0, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__filing(void) {
    struct {
        PyObject **at;
        const char *text;
    } strings[] = {
        {&s_pod, "pod"}, {&s_node, "node"}, {&s_url, "url"}, {&s_target, "target"},
        {&s_local_rank_field, "local_rank"}, {&s_world_size, "world_size"},
        {&s_model, "model"}, {&s_gpu, "gpu"}, {&s_pid, "pid"}, {&s_how, "how"}, {&s_type, "type"},
        {&s_uncorrected, "uncorrected"}, {&s_ecc_uncorrected, "ecc_uncorrected"},
        {&s_command, "command"}, {&s_user, "user"}, {&s_state, "state"},
        {&s_gpu_memory_bytes, "gpu_memory_bytes"}, {&s_gpus, "gpus"}, {&s_empty, ""},
        {&s_setdefault, "setdefault"}, {&s_add, "add"}, {&s_ranks, "ranks"},
        {&s_gpus_attr, "gpus"}, {&s_procs, "procs"}, {&s_job, "job"},
        {&s_rank_memo, "rank_memo"}, {&s_gpu_memo, "gpu_memo"},
        {&s_memo_labels, "memo_labels"}, {&s_job_name, "job_name"},
    };
    for (size_t i = 0; i < sizeof strings / sizeof *strings; i++)
        if ((*strings[i].at = PyUnicode_InternFromString(strings[i].text)) == NULL)
            return NULL;
    if ((one_float = PyFloat_FromDouble(1.0)) == NULL || (one_int = PyLong_FromLong(1)) == NULL ||
        (zero_float = PyFloat_FromDouble(0.0)) == NULL)
        return NULL;
    return PyModule_Create(&module);
}
