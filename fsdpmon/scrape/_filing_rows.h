/* The rows of _filing.c: the names it files by, the helpers it reads labels with, and the
 * rank, GPU and process rows it finds or makes (filing._rank_entry, _gpu_entry, _process_entry,
 * _add_process, _add_info, _add_gpu_event), each step for step as its Python twin.
 * Included by _filing.c only, once: one translation unit, so that the compiler sees these
 * with the loop that calls them (file_one) and the module stays one optional extension
 * (pyproject.toml lists this file in its depends). */
#ifndef FSDPMON_FILING_ROWS_H
#define FSDPMON_FILING_ROWS_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The kinds of row, numbered as filing.py numbers them (setup checks). */
enum { RANK = 1, INFO, EXIT, JOB, GPU, EVENT, PROC, HOST, OTHER };

static PyObject *kinds, *add_host, *add_gpu_event;   /* from setup() */
static PyObject *n_clock_event, *n_ecc, *n_process_info, *n_process_state; /* catalog names */
static PyObject *s_rank, *s_local_rank, *s_job_label; /* labels: from setup() too */
/* The labels, row fields and attribute names filing.py spells the same (module init). */
static PyObject *s_pod, *s_node, *s_url, *s_target, *s_local_rank_field, *s_world_size, *s_model, *s_gpu, *s_pid, *s_how,
    *s_type, *s_uncorrected, *s_ecc_uncorrected, *s_command, *s_user, *s_state,
    *s_gpu_memory_bytes, *s_gpus, *s_empty, *s_setdefault, *s_add, *s_ranks, *s_gpus_attr,
    *s_procs, *s_job, *s_rank_memo, *s_gpu_memo, *s_memo_labels, *s_job_name;
static PyObject *gpu_attributes, *process_owner, *one_float, *one_int, *zero_float;

/* labels.get(key, fallback): borrowed; NULL with an error set on failure. */
static PyObject *get(PyObject *labels, PyObject *key, PyObject *fallback) {
    PyObject *value = PyDict_GetItemWithError(labels, key);
    return value != NULL || PyErr_Occurred() ? value : fallback;
}

/* filing.as_int: int(text), None where that raises ValueError. New reference. */
static PyObject *as_int(PyObject *text) {
    PyObject *number = PyNumber_Long(text);
    if (number == NULL && PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    return number;
}

/* Whether a label's value (NULL: missing) wins an `or`: 1, 0, or -1 on error. */
static int truthy(PyObject *value) { return value == NULL || value == Py_None ? 0 : PyObject_IsTrue(value); }

/* The accumulators' parts file_samples uses (borrowed from the Acc, which holds them). */
typedef struct {
    PyObject *acc, *ranks, *gpus, *procs, *job, *rank_memo, *gpu_memo, *memo_labels;
} Parts;

static int attribute(PyObject *acc, PyObject *name, PyObject **out) {
    PyObject *value = PyObject_GetAttr(acc, name);
    if (value == NULL)
        return -1;
    *out = value;
    Py_DECREF(value); /* the Acc keeps it alive */
    return 0;
}

static int parts_of(PyObject *acc, Parts *p) {
    p->acc = acc;
    return attribute(acc, s_ranks, &p->ranks) || attribute(acc, s_gpus_attr, &p->gpus) ||
           attribute(acc, s_procs, &p->procs) || attribute(acc, s_job, &p->job) ||
           attribute(acc, s_rank_memo, &p->rank_memo) ||
           attribute(acc, s_gpu_memo, &p->gpu_memo) ||
           attribute(acc, s_memo_labels, &p->memo_labels)
               ? -1
               : 0;
}

/* `acc.<name> = acc.<name> or value` */
static int keep_first(PyObject *acc, PyObject *name, PyObject *value) {
    PyObject *now = PyObject_GetAttr(acc, name);
    if (now == NULL)
        return -1;
    int set = PyObject_IsTrue(now);
    Py_DECREF(now);
    return set < 0 ? -1 : set ? 0 : PyObject_SetAttr(acc, name, value);
}

static int memoise(Parts *p, PyObject *memo, PyObject *key, PyObject *labels, PyObject *row) {
    return PyDict_SetItem(memo, key, row) || PyList_Append(p->memo_labels, labels) ? -1 : 0;
}

/* filing._rank_entry; ``key`` is id(labels). New reference. */
static PyObject *rank_row(Parts *p, PyObject *labels, PyObject *target, PyObject *key) {
    PyObject *text = get(labels, s_rank, s_empty), *rank, *row = Py_None;
    if (text == NULL || (rank = as_int(text)) == NULL)
        return NULL;
    Py_INCREF(row);
    if (rank != Py_None) {
        PyObject *found = PyDict_GetItemWithError(p->ranks, rank);
        if (found == NULL && PyErr_Occurred())
            goto fail;
        if (found != NULL) {
            Py_SETREF(row, Py_NewRef(found));
        } else {
            PyObject *pod = NULL, *node = NULL, *url = NULL, *local = NULL, *local_text;
            if ((pod = PyObject_GetAttr(target, s_pod)) && (node = PyObject_GetAttr(target, s_node)) &&
                (url = PyObject_GetAttr(target, s_url)) &&
                (local_text = get(labels, s_local_rank, s_empty)) && (local = as_int(local_text)))
                Py_SETREF(row, PyDict_New());
            else
                Py_CLEAR(row);
            if (row != NULL && (PyDict_SetItem(row, s_pod, pod) || PyDict_SetItem(row, s_node, node) ||
                                PyDict_SetItem(row, s_target, url) ||
                                PyDict_SetItem(row, s_local_rank_field, local)))
                Py_CLEAR(row);
            Py_XDECREF(pod);
            Py_XDECREF(node);
            Py_XDECREF(url);
            Py_XDECREF(local);
            PyObject *job;
            if (row == NULL || PyDict_SetItem(p->ranks, rank, row) ||
                (job = get(labels, s_job_label, s_empty)) == NULL ||
                keep_first(p->acc, s_job_name, job))
                goto fail;
        }
    }
    Py_DECREF(rank);
    if (memoise(p, p->rank_memo, key, labels, row))
        Py_CLEAR(row);
    return row;
fail:
    Py_DECREF(rank);
    Py_XDECREF(row);
    return NULL;
}

/* filing._gpu_entry. New reference. */
static PyObject *gpu_row(Parts *p, PyObject *labels, PyObject *key) {
    PyObject *node = get(labels, s_node, s_empty), *gpu_id = node ? get(labels, s_gpu, s_empty) : NULL;
    if (gpu_id == NULL)
        return NULL;
    PyObject *where = PyTuple_Pack(2, node, gpu_id), *gpu;
    if (where == NULL)
        return NULL;
    gpu = PyDict_GetItemWithError(p->gpus, where);
    if (gpu != NULL) {
        Py_INCREF(gpu);
    } else if (PyErr_Occurred() || (gpu = PyDict_New()) == NULL || PyDict_SetItem(p->gpus, where, gpu)) {
        Py_DECREF(where);
        Py_XDECREF(gpu);
        return NULL;
    }
    Py_DECREF(where);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(gpu_attributes); i++) {
        PyObject *name = PyTuple_GET_ITEM(gpu_attributes, i), *value = get(labels, name, NULL);
        int set = value == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(value);
        if (set < 0 || (set && PyObject_SetItem(gpu, name, value))) {
            Py_DECREF(gpu);
            return NULL;
        }
    }
    if (memoise(p, p->gpu_memo, key, labels, gpu))
        Py_CLEAR(gpu);
    return gpu;
}

/* filing._process_entry. New reference (None: no pid). */
static PyObject *process_row(PyObject *procs, PyObject *labels, PyObject *node) {
    PyObject *text = get(labels, s_pid, s_empty), *pid, *where, *proc;
    if (text == NULL || (pid = as_int(text)) == NULL)
        return NULL;
    if (pid == Py_None)
        return pid;
    where = PyTuple_Pack(2, node, pid);
    Py_DECREF(pid);
    if (where == NULL)
        return NULL;
    proc = PyDict_GetItemWithError(procs, where);
    if (proc != NULL || PyErr_Occurred()) {
        Py_DECREF(where);
        return Py_XNewRef(proc);
    }
    if ((proc = PyDict_New()) == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(process_owner); i++) {
        PyObject *name = PyTuple_GET_ITEM(process_owner, i), *value = get(labels, name, NULL);
        int set = value == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(value);
        if (set < 0 || (set && PyDict_SetItem(proc, name, value)))
            goto fail;
    }
    if (PyDict_SetItem(procs, where, proc))
        goto fail;
    Py_DECREF(where);
    return proc;
fail:
    Py_DECREF(where);
    Py_XDECREF(proc);
    return NULL;
}

static int store(PyObject *row, PyObject *key, PyObject *value) { return PyObject_SetItem(row, key, value); }

/* row[key] = labels.get(label, "") */
static int store_label(PyObject *row, PyObject *key, PyObject *labels, PyObject *label) {
    PyObject *value = get(labels, label, s_empty);
    return value == NULL ? -1 : store(row, key, value);
}

/* proc["gpu_memory_bytes"] = float(proc.get("gpu_memory_bytes", 0.0)) + value;
 * proc.setdefault("gpus", set()).add(labels.get("gpu", "")) */
static int add_gpu_memory(PyObject *proc, PyObject *labels, PyObject *value) {
    PyObject *held = get(proc, s_gpu_memory_bytes, zero_float), *number, *sum;
    if (held == NULL || (number = PyNumber_Float(held)) == NULL)
        return -1;
    sum = PyNumber_Add(number, value);
    Py_DECREF(number);
    if (sum == NULL || store(proc, s_gpu_memory_bytes, sum)) {
        Py_XDECREF(sum);
        return -1;
    }
    Py_DECREF(sum);
    PyObject *fresh = PySet_New(NULL), *gpus, *gpu = get(labels, s_gpu, s_empty), *done;
    if (fresh == NULL || gpu == NULL) {
        Py_XDECREF(fresh);
        return -1;
    }
    gpus = PyObject_CallMethodObjArgs(proc, s_setdefault, s_gpus, fresh, NULL);
    Py_DECREF(fresh);
    if (gpus == NULL)
        return -1;
    done = PyObject_CallMethodOneArg(gpus, s_add, gpu);
    Py_DECREF(gpus);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* filing._add_process */
static int add_process(PyObject *proc, PyObject *name, PyObject *key, PyObject *labels,
                       PyObject *value) {
    int has_key = PyObject_IsTrue(key), is;
    if (has_key)
        return has_key < 0 ? -1 : store(proc, key, value);
    if ((is = PyObject_RichCompareBool(name, n_process_info, Py_EQ)) != 0) {
        if (is < 0 || store_label(proc, s_command, labels, s_command) ||
            store_label(proc, s_user, labels, s_user))
            return -1;
        PyObject *text = get(labels, s_rank, s_empty), *rank = text ? as_int(text) : NULL;
        int failed = rank == NULL || store(proc, s_rank, rank);
        Py_XDECREF(rank);
        return failed ? -1 : 0;
    }
    if ((is = PyObject_RichCompareBool(name, n_process_state, Py_EQ)) != 0) {
        if (is < 0 || (is = PyObject_RichCompareBool(value, one_int, Py_EQ)) < 0)
            return -1;
        return is ? store_label(proc, s_state, labels, s_state) : 0;
    }
    return add_gpu_memory(proc, labels, value);
}

/* filing._add_info */
static int add_info(Parts *p, PyObject *row, PyObject *labels) {
    PyObject *node = get(labels, s_node, NULL), *text, *size;
    int named = node == NULL ? (PyErr_Occurred() ? -1 : 0) : PyObject_IsTrue(node);
    if (named < 0)
        return -1;
    if (!named && (node = PyObject_GetItem(row, s_node)) == NULL)
        return -1;
    int failed = store(row, s_node, node);
    if (!named)
        Py_DECREF(node);
    if (failed || (text = get(labels, s_world_size, s_empty)) == NULL || (size = as_int(text)) == NULL)
        return -1;
    failed = store(row, s_world_size, size);
    Py_DECREF(size);
    PyObject *model;
    return failed || (model = get(labels, s_model, s_empty)) == NULL ||
                   keep_first(p->acc, s_model, model)
               ? -1
               : 0;
}

/* filing._add_gpu_event, the common cases here: no clock event active, an ECC count. */
static int gpu_event(PyObject *gpu, PyObject *name, PyObject *labels, PyObject *value) {
    int is = PyObject_RichCompareBool(name, n_clock_event, Py_EQ);
    if (is < 0)
        return -1;
    if (is) {
        int active = PyObject_IsTrue(value);
        if (active <= 0)
            return active;
    } else if ((is = PyObject_RichCompareBool(name, n_ecc, Py_EQ)) != 0) {
        if (is < 0)
            return -1;
        PyObject *type = get(labels, s_type, Py_None);
        if (type == NULL || (is = PyObject_RichCompareBool(type, s_uncorrected, Py_EQ)) < 0)
            return -1;
        return is ? store(gpu, s_ecc_uncorrected, value) : 0;
    }
    PyObject *done = PyObject_CallFunctionObjArgs(add_gpu_event, gpu, name, labels, value, NULL);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* The row a sample's labels memoise in ``memo`` (by ``key``, id(labels)); found anew by
 * ``entry`` when absent, or (``or_entry``) also when the row found is empty (filing's
 * `memo.get(...) or entry(...)`). New reference, NULL on error. */
static PyObject *memo_row(Parts *p, PyObject *memo, PyObject *key, PyObject *labels,
                          PyObject *target, int gpu, int or_entry) {
    PyObject *row = PyDict_GetItemWithError(memo, key);
    if (row == NULL && PyErr_Occurred())
        return NULL;
    if (row != NULL && row != Py_None && or_entry) {
        int full = PyObject_IsTrue(row);
        if (full < 0)
            return NULL;
        if (!full)
            row = NULL;
    } else if (row == Py_None && gpu) {
        row = NULL; /* `gpu_memo.get(id) is None`: a GPU's memo never holds None */
    }
    if (row != NULL)
        return Py_NewRef(row);
    return gpu ? gpu_row(p, labels, key) : rank_row(p, labels, target, key);
}

#endif /* FSDPMON_FILING_ROWS_H */
