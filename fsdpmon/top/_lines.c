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

/* float() of the token, or -1 (no exception set) when it does not read whole. */
static int read_value(Line *line, double *value) {
    char buffer[MAX_TOKEN + 1];
    Py_ssize_t n = line->end - line->token;
    if (n == 0 || n > MAX_TOKEN)
        return -1;
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

static PyMethodDef methods[] = {
    {"fill", (PyCFunction)(void (*)(void))fill, METH_FASTCALL,
     "fill(old, new, slots, count): the values of `new` by slot, or None (see the module)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lines", NULL, 0, methods, NULL, NULL, NULL,
                                    NULL};

PyMODINIT_FUNC PyInit__lines(void) {
    const char *chars = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.+-";
    for (const char *c = chars; *c; c++)
        token_char[(unsigned char)*c] = 1;
    return PyModule_Create(&module);
}
