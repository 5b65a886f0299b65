/* A body checked against its target's last one, line by line, and its values read: the C half
 * of top's layouts (layout.template_slots says why what this takes is what the regex scan would
 * read; tests/test_template.py checks that on every case it has).
 *
 * fill(old, new, slots, count) -> list of `count` floats, or None when `new` is not `old`
 * with other values: the same number of lines, and each line the same but for its last token
 * (the text after its last run of spaces or tabs, before any trailing ones), which may differ
 * only where the old line's prefix holds more than blanks and both tokens are made of
 * [0-9A-Za-z.+-]. Line i is the text from the i-th newline of the buffers to the next (both
 * start with one and end with one); slots holds one native int per line: where that line's
 * token goes in the list, or -1. A token that float() would not read whole gives None too.
 *
 * fill_rows(layout, values, acc, target, row_of, sample) -> the other samples, or None:
 * layout.file_values (its Python twin) for a list of floats, step for step: None (nothing filed)
 * for a NaN or a negative count; each group's figures stored in its cell's row (found by row_of
 * on its first use this refresh); the samples made as ``sample`` tuples. It reads the layout's
 * and the cells' attributes by name (layout.Layout, layout.Cell) and raises where they are not
 * what layout.py makes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define MAX_TOKEN 63 /* longer values are left to the Python path */

static unsigned char token_char[256];

static int blank(unsigned char c) { return c == ' ' || c == '\t'; }

typedef struct {
    const char *start; /* the line's first byte */
    Py_ssize_t token;  /* offset of the last token */
    Py_ssize_t end;    /* offset just past it (trailing blanks follow) */
    Py_ssize_t length; /* up to the newline */
} Line;

/* The line starting at p, ending at the newline at or after p (there is always one). */
static Line line_at(const char *p, const char *limit) {
    Line line;
    const char *nl = memchr(p, '\n', (size_t)(limit - p));
    line.start = p;
    line.length = nl - p;
    Py_ssize_t e = line.length;
    while (e > 0 && blank((unsigned char)p[e - 1]))
        e--;
    Py_ssize_t s = e;
    while (s > 0 && !blank((unsigned char)p[s - 1]))
        s--;
    line.token = s;
    line.end = e;
    return line;
}

static int all_token_chars(const char *p, Py_ssize_t n) {
    if (n == 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (!token_char[(unsigned char)p[i]])
            return 0;
    return 1;
}

static int holds_more_than_blanks(const char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++)
        if (!blank((unsigned char)p[i]))
            return 1;
    return 0;
}

/* 1 when the new line may stand for the old one. */
static int same_but_token(Line *old, Line *new) {
    if (old->token != new->token || old->length - old->end != new->length - new->end)
        return 0;
    if (memcmp(old->start, new->start, (size_t)old->token) != 0)
        return 0;
    if (memcmp(old->start + old->end, new->start + new->end, (size_t)(old->length - old->end)))
        return 0;
    Py_ssize_t old_n = old->end - old->token, new_n = new->end - new->token;
    if (old_n == new_n && memcmp(old->start + old->token, new->start + new->token,
                                 (size_t)old_n) == 0)
        return 1;
    return holds_more_than_blanks(old->start, old->token) &&
           all_token_chars(old->start + old->token, old_n) &&
           all_token_chars(new->start + new->token, new_n);
}

/* 10^0 .. 10^22: each exactly a double (5^22 < 2^53). */
static const double exact_tens[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                    1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                    1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
#define EXACT_MANTISSA (1ULL << 53)

/* The token as a plain decimal ([+-]digits[.digits][(e|E)[+-]digits]) whose digits make an
 * integer m <= 2^53 and whose value is m * 10^k with |k| <= 22: then m and 10^|k| are doubles
 * exactly and one IEEE multiplication or division rounds their product or quotient correctly,
 * which is what a correctly rounded strtod (PyOS_string_to_double, float()) returns (Clinger's
 * fast path; dtoa.c takes it too). 0 with the value, or -1 for any other token (the caller then
 * asks PyOS_string_to_double). Most exposition values are such decimals, and
 * PyOS_string_to_double costs more than the rest of a line: it sets and restores the x87
 * control word around each conversion. */
static int read_decimal(const char *p, Py_ssize_t n, double *value) {
    const char *end = p + n;
    int negative = 0, digits = 0;
    unsigned long long m = 0;
    long k = 0;
    if (p < end && (*p == '+' || *p == '-'))
        negative = *p++ == '-';
    for (; p < end && *p >= '0' && *p <= '9'; p++, digits++) {
        m = m * 10 + (unsigned long long)(*p - '0');
        if (m > EXACT_MANTISSA)
            return -1;
    }
    if (p < end && *p == '.') {
        for (p++; p < end && *p >= '0' && *p <= '9'; p++, digits++, k--) {
            m = m * 10 + (unsigned long long)(*p - '0');
            if (m > EXACT_MANTISSA)
                return -1;
        }
    }
    if (digits == 0)
        return -1;
    if (p < end && (*p == 'e' || *p == 'E')) {
        int negative_exponent = 0, exponent_digits = 0;
        long exponent = 0;
        if (++p < end && (*p == '+' || *p == '-'))
            negative_exponent = *p++ == '-';
        for (; p < end && *p >= '0' && *p <= '9'; p++, exponent_digits++) {
            exponent = exponent * 10 + (*p - '0');
            if (exponent > 1000)
                return -1;
        }
        if (exponent_digits == 0)
            return -1;
        k += negative_exponent ? -exponent : exponent;
    }
    if (p != end || k < -22 || k > 22)
        return -1;
    double v = (double)m;
    v = k < 0 ? v / exact_tens[-k] : v * exact_tens[k];
    *value = negative ? -v : v;
    return 0;
}

/* float() of the token, or -1 (no exception set) when it does not read whole. */
static int read_value(Line *line, double *value) {
    char buffer[MAX_TOKEN + 1];
    Py_ssize_t n = line->end - line->token;
    if (n == 0 || n > MAX_TOKEN)
        return -1;
    if (read_decimal(line->start + line->token, n, value) == 0)
        return 0;
    memcpy(buffer, line->start + line->token, (size_t)n);
    buffer[n] = '\0';
    char *end = NULL;
    *value = PyOS_string_to_double(buffer, &end, NULL);
    if (*value == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return end == buffer + n ? 0 : -1;
}

static PyObject *fill(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    Py_buffer old, new, slots;
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "fill(old, new, slots, count)");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    if (count < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "count must be >= 0");
        return NULL;
    }
    if (PyObject_GetBuffer(args[0], &old, PyBUF_SIMPLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(args[1], &new, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&old);
        return NULL;
    }
    if (PyObject_GetBuffer(args[2], &slots, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&old);
        PyBuffer_Release(&new);
        return NULL;
    }
    PyObject *out = NULL, *values = PyList_New(count);
    const char *o = old.buf, *n = new.buf, *o_end = o + old.len, *n_end = n + new.len;
    const char *slot = slots.buf; /* ints, read by memcpy: the buffer may be unaligned */
    Py_ssize_t lines = slots.len / (Py_ssize_t)sizeof(int), filled = 0;
    if (values == NULL)
        goto done;
    if (old.len == 0 || new.len == 0 || o[0] != '\n' || n[0] != '\n' || o_end[-1] != '\n' ||
        n_end[-1] != '\n')
        goto mismatch;
    o++;
    n++;
    for (Py_ssize_t i = 0; i < lines; i++) {
        if (o >= o_end || n >= n_end)
            goto mismatch;
        Line ol = line_at(o, o_end), nl = line_at(n, n_end);
        if (!same_but_token(&ol, &nl))
            goto mismatch;
        int at;
        memcpy(&at, slot + i * (Py_ssize_t)sizeof(int), sizeof(int));
        if (at >= 0) {
            double value;
            if (at >= count || PyList_GET_ITEM(values, at) != NULL || read_value(&nl, &value))
                goto mismatch;
            PyObject *number = PyFloat_FromDouble(value);
            if (number == NULL)
                goto done;
            PyList_SET_ITEM(values, at, number);
            filled++;
        }
        o += ol.length + 1;
        n += nl.length + 1;
    }
    if (o != o_end || n != n_end || filled != count)
        goto mismatch;
    out = values;
    values = NULL;
    goto done;
mismatch:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(values);
    PyBuffer_Release(&old);
    PyBuffer_Release(&new);
    PyBuffer_Release(&slots);
    return out;
}

/* The attributes fill_rows reads, by name: a Layout's and a Cell's (layout.py). One missing,
 * or of another type, raises: a layout is made by layout.layout_of alone, so that is a bug
 * here or there, which the tests must see (not a body quietly left to the Python twin). */
static PyObject *s_groups, *s_counted, *s_names, *s_labels, *s_first_sample, *s_acc, *s_row,
    *s_kind;

/* The parts of a layout fill_rows reads, checked against the values before anything is filed. */
typedef struct {
    PyObject *groups, *counted, *names, *labels;
    Py_ssize_t first;
} Laid;

static int laid_error(const char *what) {
    PyErr_Format(PyExc_TypeError, "fill_rows: the layout's %s is not what layout.py makes", what);
    return -1;
}

/* 0, or -1 with an exception set. */
static int laid_out(PyObject *layout, Py_ssize_t count, Laid *laid) {
    PyObject *first = NULL;
    int failed = -1;
    if (!(laid->groups = PyObject_GetAttr(layout, s_groups)) ||
        !(laid->counted = PyObject_GetAttr(layout, s_counted)) ||
        !(laid->names = PyObject_GetAttr(layout, s_names)) ||
        !(laid->labels = PyObject_GetAttr(layout, s_labels)) ||
        !(first = PyObject_GetAttr(layout, s_first_sample)))
        goto done;
    if (!PyTuple_Check(laid->groups) || !PyTuple_Check(laid->counted) ||
        !PyTuple_Check(laid->names) || !PyTuple_Check(laid->labels) || !PyLong_Check(first)) {
        laid_error("groups, counted, names, labels or first_sample");
        goto done;
    }
    laid->first = PyLong_AsSsize_t(first);
    if (laid->first < 0 || laid->first > count || PyTuple_GET_SIZE(laid->names) != count - laid->first ||
        PyTuple_GET_SIZE(laid->labels) != count - laid->first) {
        if (!PyErr_Occurred())
            laid_error("first_sample, names or labels (against the values)");
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(laid->counted); i++) {
        Py_ssize_t at = PyLong_AsSsize_t(PyTuple_GET_ITEM(laid->counted, i));
        if (at < 0 || at >= count) {
            if (!PyErr_Occurred())
                laid_error("counted");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(laid->groups); i++) {
        PyObject *group = PyTuple_GET_ITEM(laid->groups, i); /* a layout.Group */
        if (!PyTuple_Check(group) || PyTuple_GET_SIZE(group) != 4 ||
            !PyTuple_Check(PyTuple_GET_ITEM(group, 1))) {
            laid_error("groups");
            goto done;
        }
        Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(group, 2));
        Py_ssize_t stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(group, 3));
        if (start < 0 || stop > count || stop - start != PyTuple_GET_SIZE(PyTuple_GET_ITEM(group, 1))) {
            if (!PyErr_Occurred())
                laid_error("groups' spans");
            goto done;
        }
    }
    failed = 0;
done:
    Py_XDECREF(first);
    return failed;
}

/* The cell's row this refresh, as Cell.row_in: `if cell.acc is not acc: cell.acc, cell.row =
 * acc, row_of(acc, cell.kind, cell.labels, target)`. New reference; NULL on error. */
static PyObject *row_in(PyObject *cell, PyObject *acc, PyObject *target, PyObject *row_of) {
    PyObject *found = PyObject_GetAttr(cell, s_acc);
    if (found == NULL)
        return NULL;
    Py_DECREF(found); /* only compared */
    if (found != acc) {
        PyObject *kind = PyObject_GetAttr(cell, s_kind), *labels = NULL, *row = NULL;
        if (kind != NULL && (labels = PyObject_GetAttr(cell, s_labels)) != NULL)
            row = PyObject_CallFunctionObjArgs(row_of, acc, kind, labels, target, NULL);
        Py_XDECREF(kind);
        Py_XDECREF(labels);
        if (row == NULL || PyObject_SetAttr(cell, s_acc, acc) || PyObject_SetAttr(cell, s_row, row)) {
            Py_XDECREF(row);
            return NULL;
        }
        return row;
    }
    return PyObject_GetAttr(cell, s_row);
}

static PyObject *fill_rows(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 6 || !PyList_CheckExact(args[1]) || !PyType_Check(args[5]) ||
        !PyType_IsSubtype((PyTypeObject *)args[5], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "fill_rows(layout, values: list, acc, target, row_of, sample)");
        return NULL;
    }
    PyObject *values = args[1], *acc = args[2], *target = args[3], *row_of = args[4], *out = NULL;
    PyTypeObject *sample = (PyTypeObject *)args[5];
    Py_ssize_t count = PyList_GET_SIZE(values);
    Laid laid = {NULL, NULL, NULL, NULL, 0};
    for (Py_ssize_t i = 0; i < count; i++)
        if (!PyFloat_CheckExact(PyList_GET_ITEM(values, i))) {
            PyErr_SetString(PyExc_TypeError, "fill_rows: the values are floats");
            return NULL;
        }
    if (laid_out(args[0], count, &laid))
        goto done;
    for (Py_ssize_t i = 0; i < count; i++) { /* any(map(math.isnan, values)) */
        double v = PyFloat_AS_DOUBLE(PyList_GET_ITEM(values, i));
        if (v != v)
            goto refused;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(laid.counted); i++) {
        PyObject *v = PyList_GET_ITEM(values, PyLong_AsSsize_t(PyTuple_GET_ITEM(laid.counted, i)));
        if (PyFloat_AS_DOUBLE(v) < 0)
            goto refused;
    }
    for (Py_ssize_t g = 0; g < PyTuple_GET_SIZE(laid.groups); g++) {
        PyObject *group = PyTuple_GET_ITEM(laid.groups, g), *fields = PyTuple_GET_ITEM(group, 1);
        PyObject *row = row_in(PyTuple_GET_ITEM(group, 0), acc, target, row_of);
        if (row == NULL)
            goto done;
        Py_ssize_t start = PyLong_AsSsize_t(PyTuple_GET_ITEM(group, 2));
        int failed = 0;
        for (Py_ssize_t k = 0; row != Py_None && k < PyTuple_GET_SIZE(fields) && !failed; k++)
            failed = PyObject_SetItem(row, PyTuple_GET_ITEM(fields, k), PyList_GET_ITEM(values, start + k));
        Py_DECREF(row);
        if (failed)
            goto done;
    }
    Py_ssize_t made = count - laid.first;
    if ((out = PyList_New(made)) == NULL)
        goto done;
    for (Py_ssize_t j = 0; j < made; j++) { /* tuple.__new__(sample, (name, labels, value)) */
        PyObject *one = sample->tp_alloc(sample, 3);
        if (one == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(one, 0, Py_NewRef(PyTuple_GET_ITEM(laid.names, j)));
        PyTuple_SET_ITEM(one, 1, Py_NewRef(PyTuple_GET_ITEM(laid.labels, j)));
        PyTuple_SET_ITEM(one, 2, Py_NewRef(PyList_GET_ITEM(values, laid.first + j)));
        PyList_SET_ITEM(out, j, one);
    }
    goto done;
refused:
    out = Py_NewRef(Py_None);
done:
    Py_XDECREF(laid.groups);
    Py_XDECREF(laid.counted);
    Py_XDECREF(laid.names);
    Py_XDECREF(laid.labels);
    return out;
}

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(old, new, slots, count): the values of `new` by slot, or None (see the module)."},
    {"fill_rows", (PyCFunction)(void (*)(void))fill_rows, METH_FASTCALL,
     "fill_rows(layout, values, acc, target, row_of, sample): layout.file_values (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lines", NULL, 0, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__lines(void) {
    const char *chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-";
    for (const char *c = chars; *c; c++)
        token_char[(unsigned char)*c] = 1;
    struct {
        PyObject **at;
        const char *text;
    } names[] = {{&s_groups, "groups"}, {&s_counted, "counted"}, {&s_names, "names"},
                 {&s_labels, "labels"}, {&s_first_sample, "first_sample"}, {&s_acc, "acc"},
                 {&s_row, "row"}, {&s_kind, "kind"}};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((*names[i].at = PyUnicode_InternFromString(names[i].text)) == NULL)
            return NULL;
    return PyModule_Create(&module);
}
