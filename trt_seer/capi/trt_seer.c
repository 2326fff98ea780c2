/* libtrt_seer: the C ABI of trt_seer.h over the Python runtime, embedded.
 *
 * The first call starts one CPython interpreter for the process (or joins the host's, when the
 * library is loaded into a Python process), imports trt_seer.capi.bridge and releases the GIL;
 * each call takes the GIL, wraps the caller's buffers in memoryviews (no copy) and calls the
 * bridge, which calls trt_seer.runtime.load / Model.infer. A prepared call copies inputs into, and
 * outputs out of, the Python call's own memory without the GIL and takes it only for the run.
 * The interpreter is never finalized.
 * Build with `python -m trt_seer.capi.build --out DIR`; docs/RUNTIME.md says what this costs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trt_seer.h"

#ifndef TRT_SEER_PYTHON /* the python executable the library was built for (finds its prefix) */
#define TRT_SEER_PYTHON ""
#endif
#ifndef TRT_SEER_PACKAGE_DIR /* where trt_seer was imported from at build time (last on sys.path) */
#define TRT_SEER_PACKAGE_DIR ""
#endif

struct trt_seer_model {
    PyObject *model; /* a trt_seer.runtime.Model */
    char backend[32];
    int32_t n_inputs, n_outputs;
    trt_seer_tensor_info *infos; /* inputs, then outputs */
};

static const char *const DTYPE_NAMES[] = {"float32", "float16", "bfloat16", "float64", "int64",
                                          "int32", "int8", "uint8", "bool"};
static const size_t DTYPE_SIZES[] = {4, 2, 2, 8, 8, 4, 1, 1, 1};
#define N_DTYPES ((int)(sizeof DTYPE_SIZES / sizeof DTYPE_SIZES[0]))

static _Thread_local char last_error[1024];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static PyObject *bridge; /* NULL when the runtime could not start; init_error says why */
static char init_error[1024];

static trt_seer_status fail(trt_seer_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    for (char *c = last_error; *c; ++c) /* one line */
        if (*c == '\n' || *c == '\r') *c = ' ';
    return status;
}

static trt_seer_status done(trt_seer_status status) {
    if (status == TRT_SEER_OK) last_error[0] = '\0';
    return status;
}

/* GIL held, an exception set: its text into buf; the exception is cleared. */
static void exception_text(char *buf, size_t size) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    const char *s = text ? PyUnicode_AsUTF8(text) : NULL;
    snprintf(buf, size, "%s: %s", type ? ((PyTypeObject *)type)->tp_name : "error", s ? s : "?");
    PyErr_Clear();
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
}

/* ------------------------------------------------------------------ starting the interpreter */

static int start_interpreter(void) {
    const char *python = getenv("TRT_SEER_PYTHON");
    if (python == NULL || *python == '\0') python = TRT_SEER_PYTHON;
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.install_signal_handlers = 0; /* SIGINT and friends stay the service's */
    config.parse_argv = 0;
    PyStatus st = PyStatus_Ok();
    if (*python) st = PyConfig_SetBytesString(&config, &config.program_name, python);
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
        snprintf(init_error, sizeof init_error, "cannot start the embedded Python (%s): %s",
                 *python ? python : "default", st.err_msg ? st.err_msg : "unknown error");
        return 0;
    }
    return 1;
}

static void import_bridge(void) { /* GIL held */
    PyObject *path = PySys_GetObject("path"); /* borrowed */
    if (*TRT_SEER_PACKAGE_DIR && path != NULL) {
        PyObject *dir = PyUnicode_DecodeFSDefault(TRT_SEER_PACKAGE_DIR);
        if (dir == NULL || PyList_Append(path, dir) != 0) PyErr_Clear();
        Py_XDECREF(dir);
    }
    bridge = PyImport_ImportModule("trt_seer.capi.bridge");
    if (bridge == NULL) {
        char why[768];
        exception_text(why, sizeof why);
        snprintf(init_error, sizeof init_error, "cannot import trt_seer.capi.bridge (%s); install trt_seer "
                 "into the Python this library was built for or set PYTHONPATH", why);
    }
}

static void init(void) {
    if (Py_IsInitialized()) { /* loaded into a Python process: use its interpreter */
        PyGILState_STATE g = PyGILState_Ensure();
        import_bridge();
        PyGILState_Release(g);
        return;
    }
    if (!start_interpreter()) return;
    import_bridge();
    PyEval_SaveThread(); /* release the GIL: every call takes it with PyGILState_Ensure */
}

static trt_seer_status ready(void) {
    pthread_once(&init_once, init);
    return bridge ? TRT_SEER_OK : fail(TRT_SEER_E_INTERNAL, "%s", init_error);
}

/* GIL held, an exception set: its status and one-line message from bridge.status_of. */
static trt_seer_status from_exception(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *r = value ? PyObject_CallMethod(bridge, "status_of", "O", value) : NULL;
    int code = TRT_SEER_E_INTERNAL;
    const char *msg = NULL;
    trt_seer_status status;
    if (r != NULL && PyArg_ParseTuple(r, "is", &code, &msg))
        status = fail((trt_seer_status)code, "%s", msg);
    else
        status = fail(TRT_SEER_E_INTERNAL, "the runtime raised an exception it could not describe");
    PyErr_Clear();
    Py_XDECREF(r);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return status;
}

/* bridge.<fn>(*args); steals args. */
static PyObject *call(const char *fn, PyObject *args) {
    if (args == NULL) return NULL;
    PyObject *f = PyObject_GetAttrString(bridge, fn);
    PyObject *r = f ? PyObject_CallObject(f, args) : NULL;
    Py_XDECREF(f);
    Py_DECREF(args);
    return r;
}

/* ------------------------------------------------------------------ conversions */

static int read_dims(PyObject *seq, int64_t *dims, int32_t *ndim) {
    Py_ssize_t n = PyTuple_Check(seq) ? PyTuple_GET_SIZE(seq) : -1;
    if (n < 0 || n > TRT_SEER_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "a shape has %zd dimensions; the C ABI holds %d", n, TRT_SEER_MAX_DIMS);
        return 0;
    }
    for (Py_ssize_t i = 0; i < n; ++i) {
        dims[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(seq, i));
        if (dims[i] == -1 && PyErr_Occurred()) return 0;
    }
    if (ndim) *ndim = (int32_t)n;
    return 1;
}

static int fill_info(PyObject *item, trt_seer_tensor_info *info) {
    const char *name;
    int code;
    PyObject *shape, *lo, *hi;
    if (!PyArg_ParseTuple(item, "siOOO", &name, &code, &shape, &lo, &hi)) return 0;
    info->dtype = (trt_seer_dtype)code;
    if (!read_dims(shape, info->shape, &info->ndim) || !read_dims(lo, info->min_shape, NULL) ||
        !read_dims(hi, info->max_shape, NULL))
        return 0;
    info->name = strdup(name);
    return info->name != NULL || (PyErr_NoMemory(), 0);
}

static void free_model(trt_seer_model *m) {
    if (m == NULL) return;
    for (int32_t i = 0; m->infos && i < m->n_inputs + m->n_outputs; ++i) free((void *)m->infos[i].name);
    free(m->infos);
    Py_XDECREF(m->model);
    free(m);
}

/* GIL held: a trt_seer_model around a Python Model (steals it), or NULL with an exception set. */
static trt_seer_model *wrap_model(PyObject *py) {
    trt_seer_model *m = calloc(1, sizeof *m);
    if (m == NULL) return (trt_seer_model *)PyErr_NoMemory();
    m->model = py;
    PyObject *desc = call("describe", Py_BuildValue("(O)", py));
    PyObject *backend = desc ? PyObject_GetAttrString(py, "backend") : NULL;
    const char *b = backend ? PyUnicode_AsUTF8(backend) : NULL;
    int good = desc != NULL && b != NULL && PyTuple_Check(desc) && PyTuple_GET_SIZE(desc) == 2;
    if (good) {
        snprintf(m->backend, sizeof m->backend, "%s", b);
        PyObject *ins = PyTuple_GET_ITEM(desc, 0), *outs = PyTuple_GET_ITEM(desc, 1);
        m->n_inputs = (int32_t)PyList_GET_SIZE(ins);
        m->n_outputs = (int32_t)PyList_GET_SIZE(outs);
        m->infos = calloc((size_t)(m->n_inputs + m->n_outputs) + 1, sizeof *m->infos);
        good = m->infos != NULL || (PyErr_NoMemory(), 0);
        for (int32_t i = 0; good && i < m->n_inputs + m->n_outputs; ++i)
            good = fill_info(PyList_GET_ITEM(i < m->n_inputs ? ins : outs, i < m->n_inputs ? i : i - m->n_inputs),
                             &m->infos[i]);
    }
    Py_XDECREF(desc);
    Py_XDECREF(backend);
    if (!good) {
        free_model(m);
        return NULL;
    }
    return m;
}

static size_t element_count(int32_t ndim, const int64_t *shape) {
    size_t n = 1;
    for (int32_t d = 0; d < ndim; ++d) n *= (size_t)shape[d];
    return n;
}

static trt_seer_status check_inputs(int32_t n, const trt_seer_input *in, int need_data) {
    if (n < 0 || (n > 0 && in == NULL)) return fail(TRT_SEER_E_INPUT, "inputs is NULL or n_inputs (%d) < 0", n);
    for (int32_t i = 0; i < n; ++i) {
        const char *name = in[i].name ? in[i].name : "?";
        if (in[i].name == NULL) return fail(TRT_SEER_E_INPUT, "input entry %d has no name", i);
        if ((int)in[i].dtype < 0 || (int)in[i].dtype >= N_DTYPES)
            return fail(TRT_SEER_E_INPUT, "input %s has an unknown dtype code %d", name, (int)in[i].dtype);
        if (in[i].ndim < 0 || in[i].ndim > TRT_SEER_MAX_DIMS || (in[i].ndim > 0 && in[i].shape == NULL))
            return fail(TRT_SEER_E_INPUT, "input %s has ndim %d and shape %p", name, in[i].ndim, (void *)in[i].shape);
        for (int32_t d = 0; d < in[i].ndim; ++d)
            if (in[i].shape[d] < 0)
                return fail(TRT_SEER_E_INPUT, "input %s has a negative size %lld on axis %d", name,
                            (long long)in[i].shape[d], d);
        if (need_data && in[i].data == NULL) return fail(TRT_SEER_E_INPUT, "input %s has no data", name);
    }
    return TRT_SEER_OK;
}

static trt_seer_status check_outputs(int32_t n, const trt_seer_output *out, int need_data) {
    if (n < 0 || (n > 0 && out == NULL)) return fail(TRT_SEER_E_INPUT, "outputs is NULL or n_outputs (%d) < 0", n);
    for (int32_t i = 0; need_data && i < n; ++i)
        if (out[i].data == NULL)
            return fail(TRT_SEER_E_INPUT, "output %s has no buffer", out[i].name ? out[i].name : "(by index)");
    return TRT_SEER_OK;
}

/* GIL held: (names, dtype codes, shapes, memoryviews or None) of the inputs. */
static PyObject *input_lists(int32_t n, const trt_seer_input *in, int with_data) {
    PyObject *names = PyList_New(n), *codes = PyList_New(n), *shapes = PyList_New(n), *bufs = PyList_New(n);
    int good = names && codes && shapes && bufs;
    for (int32_t i = 0; good && i < n; ++i) {
        PyObject *shape = PyTuple_New(in[i].ndim);
        for (int32_t d = 0; shape && d < in[i].ndim; ++d) PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(in[i].shape[d]));
        size_t nbytes = element_count(in[i].ndim, in[i].shape) * DTYPE_SIZES[in[i].dtype];
        PyObject *buf = with_data ? PyMemoryView_FromMemory((char *)in[i].data, (Py_ssize_t)nbytes, PyBUF_READ)
                                  : Py_NewRef(Py_None);
        PyList_SET_ITEM(names, i, PyUnicode_FromString(in[i].name));
        PyList_SET_ITEM(codes, i, PyLong_FromLong((long)in[i].dtype));
        PyList_SET_ITEM(shapes, i, shape);
        PyList_SET_ITEM(bufs, i, buf);
        good = shape && buf && PyList_GET_ITEM(names, i) && PyList_GET_ITEM(codes, i);
    }
    if (good) return Py_BuildValue("(NNNN)", names, codes, shapes, bufs);
    Py_XDECREF(names);
    Py_XDECREF(codes);
    Py_XDECREF(shapes);
    Py_XDECREF(bufs);
    return NULL;
}

/* GIL held: [name or None] of the outputs and, with data, their writable memoryviews. */
static PyObject *output_lists(int32_t n, const trt_seer_output *out, int with_data) {
    PyObject *names = PyList_New(n), *bufs = PyList_New(n);
    int good = names && bufs;
    for (int32_t i = 0; good && i < n; ++i) {
        PyObject *name = out[i].name ? PyUnicode_FromString(out[i].name) : Py_NewRef(Py_None);
        PyObject *buf = with_data ? PyMemoryView_FromMemory(out[i].data, (Py_ssize_t)out[i].capacity_bytes, PyBUF_WRITE)
                                  : Py_NewRef(Py_None);
        PyList_SET_ITEM(names, i, name);
        PyList_SET_ITEM(bufs, i, buf);
        good = name && buf;
    }
    if (good) return Py_BuildValue("(NN)", names, bufs);
    Py_XDECREF(names);
    Py_XDECREF(bufs);
    return NULL;
}

/* GIL held: [(dtype code, shape)] from the bridge into the output entries. */
static int store_shapes(PyObject *result, int32_t n, trt_seer_output *out) {
    if (!PyList_Check(result) || PyList_GET_SIZE(result) != n) {
        PyErr_SetString(PyExc_ValueError, "the bridge returned a malformed list of output shapes");
        return 0;
    }
    for (int32_t i = 0; i < n; ++i) {
        int code;
        PyObject *shape;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(result, i), "iO", &code, &shape)) return 0;
        if (!read_dims(shape, out[i].shape, &out[i].ndim)) return 0;
        out[i].dtype = (trt_seer_dtype)code;
    }
    return 1;
}

/* bridge.<fn>(model, names, codes, shapes, [buffers,] out_names, [out_buffers]) -> shapes. */
static trt_seer_status shapes_call(const char *fn, trt_seer_model *m, int32_t n_in, const trt_seer_input *in,
                                   int32_t n_out, trt_seer_output *out, int with_data) {
    trt_seer_status st;
    if (m == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    if ((st = check_inputs(n_in, in, with_data)) || (st = check_outputs(n_out, out, with_data))) return st;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *ins = input_lists(n_in, in, with_data), *outs = output_lists(n_out, out, with_data), *r = NULL;
    if (ins && outs) {
        PyObject *args = with_data
            ? Py_BuildValue("(OOOOOOO)", m->model, PyTuple_GET_ITEM(ins, 0), PyTuple_GET_ITEM(ins, 1),
                            PyTuple_GET_ITEM(ins, 2), PyTuple_GET_ITEM(ins, 3), PyTuple_GET_ITEM(outs, 0),
                            PyTuple_GET_ITEM(outs, 1))
            : Py_BuildValue("(OOOOO)", m->model, PyTuple_GET_ITEM(ins, 0), PyTuple_GET_ITEM(ins, 1),
                            PyTuple_GET_ITEM(ins, 2), PyTuple_GET_ITEM(outs, 0));
        r = call(fn, args);
    }
    st = (r != NULL && store_shapes(r, n_out, out)) ? TRT_SEER_OK : from_exception();
    Py_XDECREF(r);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    PyGILState_Release(g);
    return done(st);
}

/* ------------------------------------------------------------------ the ABI */

trt_seer_status trt_seer_open(const char *path, const char *backend, const char *options_json,
                              trt_seer_model **model) {
    if (model == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    *model = NULL;
    if (path == NULL) return fail(TRT_SEER_E_INPUT, "path is NULL");
    trt_seer_status st = ready();
    if (st != TRT_SEER_OK) return st;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *py = call("open_model", Py_BuildValue("(Nss)", PyUnicode_DecodeFSDefault(path),
                                                    backend ? backend : "", options_json ? options_json : ""));
    *model = py ? wrap_model(py) : NULL;
    st = *model ? TRT_SEER_OK : from_exception();
    PyGILState_Release(g);
    return done(st);
}

trt_seer_status trt_seer_backend(const trt_seer_model *model, const char **backend) {
    if (model == NULL || backend == NULL) return fail(TRT_SEER_E_INPUT, "model or backend is NULL");
    *backend = model->backend;
    return done(TRT_SEER_OK);
}

static trt_seer_status count(const trt_seer_model *model, int32_t *n, int outputs) {
    if (model == NULL || n == NULL) return fail(TRT_SEER_E_INPUT, "model or count is NULL");
    *n = outputs ? model->n_outputs : model->n_inputs;
    return done(TRT_SEER_OK);
}

trt_seer_status trt_seer_num_inputs(const trt_seer_model *model, int32_t *n) { return count(model, n, 0); }
trt_seer_status trt_seer_num_outputs(const trt_seer_model *model, int32_t *n) { return count(model, n, 1); }

static trt_seer_status info_at(const trt_seer_model *model, int32_t index, trt_seer_tensor_info *info, int outputs) {
    if (model == NULL || info == NULL) return fail(TRT_SEER_E_INPUT, "model or info is NULL");
    int32_t n = outputs ? model->n_outputs : model->n_inputs;
    if (index < 0 || index >= n)
        return fail(TRT_SEER_E_INPUT, "%s index %d is out of range: the model has %d", outputs ? "output" : "input",
                    index, n);
    *info = model->infos[(outputs ? model->n_inputs : 0) + index];
    return done(TRT_SEER_OK);
}

trt_seer_status trt_seer_input_info(const trt_seer_model *m, int32_t i, trt_seer_tensor_info *info) {
    return info_at(m, i, info, 0);
}

trt_seer_status trt_seer_output_info(const trt_seer_model *m, int32_t i, trt_seer_tensor_info *info) {
    return info_at(m, i, info, 1);
}

trt_seer_status trt_seer_output_shapes(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                                       int32_t n_outputs, trt_seer_output *outputs) {
    return shapes_call("output_shapes", model, n_inputs, inputs, n_outputs, outputs, 0);
}

trt_seer_status trt_seer_run(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                             int32_t n_outputs, trt_seer_output *outputs) {
    return shapes_call("run", model, n_inputs, inputs, n_outputs, outputs, 1);
}

/* GIL held: obj.close(), its failure as a status. */
static trt_seer_status close_object(PyObject *obj) {
    PyObject *r = PyObject_CallMethod(obj, "close", NULL);
    trt_seer_status st = r ? TRT_SEER_OK : from_exception();
    Py_XDECREF(r);
    return st;
}

trt_seer_status trt_seer_close(trt_seer_model *model) {
    if (model == NULL) return done(TRT_SEER_OK);
    PyGILState_STATE g = PyGILState_Ensure();
    trt_seer_status st = close_object(model->model);
    free_model(model);
    PyGILState_Release(g);
    return done(st);
}

/* ------------------------------------------------------------------ prepared calls */

typedef struct {
    char *name;
    trt_seer_dtype dtype;
    int32_t ndim;
    int64_t shape[TRT_SEER_MAX_DIMS];
    char *data; /* the prepared call's own memory, kept alive by `call` */
    size_t nbytes;
} place;

struct trt_seer_prepared {
    PyObject *call, *run; /* the Python PreparedCall and its bound run() */
    pthread_mutex_t busy;
    int32_t n_inputs, n_outputs;
    place *places; /* inputs, then outputs */
};

static void free_prepared(trt_seer_prepared *p) { /* GIL held */
    for (int32_t i = 0; p->places && i < p->n_inputs + p->n_outputs; ++i) free(p->places[i].name);
    free(p->places);
    Py_XDECREF(p->run);
    Py_XDECREF(p->call);
    pthread_mutex_destroy(&p->busy);
    free(p);
}

/* GIL held: one place from (address, bytes) and what it holds; 0 with an exception set. */
static int set_place(place *pl, PyObject *address, Py_ssize_t nbytes, const char *name, int32_t ndim,
                     const int64_t *shape) {
    pl->data = (char *)PyLong_AsVoidPtr(address);
    if (pl->data == NULL) return PyErr_Occurred() ? 0 : (PyErr_SetString(PyExc_ValueError, "a NULL place"), 0);
    pl->nbytes = (size_t)nbytes;
    pl->ndim = ndim;
    memcpy(pl->shape, shape, sizeof(int64_t) * (size_t)ndim);
    pl->name = strdup(name);
    return pl->name != NULL || (PyErr_NoMemory(), 0);
}

/* GIL held: the call and its places from bridge.prepare's (call, [(address, bytes)],
 * [(name, dtype code, shape, address, bytes)]); sets the output entries' dtype and shape. */
static int read_places(trt_seer_prepared *p, PyObject *r, const trt_seer_input *in, trt_seer_output *out) {
    PyObject *call, *ins, *outs;
    if (!PyArg_ParseTuple(r, "OO!O!", &call, &PyList_Type, &ins, &PyList_Type, &outs)) return 0;
    if (PyList_GET_SIZE(ins) != p->n_inputs || PyList_GET_SIZE(outs) != p->n_outputs) {
        PyErr_SetString(PyExc_ValueError, "the bridge returned malformed places");
        return 0;
    }
    p->call = Py_NewRef(call);
    if ((p->run = PyObject_GetAttrString(call, "run")) == NULL) return 0;
    for (int32_t i = 0; i < p->n_inputs; ++i) {
        PyObject *address;
        Py_ssize_t nbytes;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ins, i), "On", &address, &nbytes) ||
            !set_place(&p->places[i], address, nbytes, in[i].name, in[i].ndim, in[i].shape))
            return 0;
        p->places[i].dtype = in[i].dtype;
    }
    for (int32_t i = 0; i < p->n_outputs; ++i) {
        place *pl = &p->places[p->n_inputs + i];
        const char *name;
        int code;
        PyObject *shape, *address;
        Py_ssize_t nbytes;
        int64_t dims[TRT_SEER_MAX_DIMS];
        int32_t ndim;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(outs, i), "siOOn", &name, &code, &shape, &address, &nbytes) ||
            !read_dims(shape, dims, &ndim) || !set_place(pl, address, nbytes, name, ndim, dims))
            return 0;
        pl->dtype = (trt_seer_dtype)code;
        out[i].dtype = pl->dtype;
        out[i].ndim = pl->ndim;
        memcpy(out[i].shape, pl->shape, sizeof pl->shape);
    }
    return 1;
}

trt_seer_status trt_seer_prepare(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                                 int32_t n_outputs, trt_seer_output *outputs, trt_seer_prepared **prepared) {
    trt_seer_status st;
    if (prepared == NULL) return fail(TRT_SEER_E_INPUT, "prepared is NULL");
    *prepared = NULL;
    if (model == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    if ((st = check_inputs(n_inputs, inputs, 0)) || (st = check_outputs(n_outputs, outputs, 0))) return st;
    trt_seer_prepared *p = calloc(1, sizeof *p);
    if (p == NULL) return fail(TRT_SEER_E_INTERNAL, "out of memory");
    pthread_mutex_init(&p->busy, NULL);
    p->n_inputs = n_inputs;
    p->n_outputs = n_outputs;
    PyGILState_STATE g = PyGILState_Ensure();
    p->places = calloc((size_t)(n_inputs + n_outputs) + 1, sizeof *p->places);
    PyObject *ins = p->places ? input_lists(n_inputs, inputs, 0) : PyErr_NoMemory();
    PyObject *outs = ins ? output_lists(n_outputs, outputs, 0) : NULL, *r = NULL;
    if (ins && outs)
        r = call("prepare", Py_BuildValue("(OOOOO)", model->model, PyTuple_GET_ITEM(ins, 0), PyTuple_GET_ITEM(ins, 1),
                                          PyTuple_GET_ITEM(ins, 2), PyTuple_GET_ITEM(outs, 0)));
    if (r != NULL && read_places(p, r, inputs, outputs)) {
        st = TRT_SEER_OK;
        *prepared = p;
    } else {
        st = from_exception();
        PyObject *closed = p->call ? PyObject_CallMethod(p->call, "close", NULL) : Py_NewRef(Py_None);
        if (closed == NULL) /* the first failure is the one reported */
            fprintf(stderr, "trt_seer: closing a call that failed to prepare also failed\n"), PyErr_Print();
        Py_XDECREF(closed);
        free_prepared(p);
    }
    Py_XDECREF(r);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    PyGILState_Release(g);
    return done(st);
}

static void format_shape(char *buf, size_t size, int32_t ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, size, "[");
    for (int32_t d = 0; d < ndim && used < size; ++d)
        used += (size_t)snprintf(buf + used, size - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < size) snprintf(buf + used, size - used, "]");
}

static trt_seer_status match_inputs(const trt_seer_prepared *p, int32_t n, const trt_seer_input *in) {
    if (n != p->n_inputs) return fail(TRT_SEER_E_INPUT, "this call was prepared for %d inputs; got %d", p->n_inputs, n);
    for (int32_t i = 0; i < n; ++i) {
        const place *pl = &p->places[i];
        if (strcmp(in[i].name, pl->name) != 0)
            return fail(TRT_SEER_E_INPUT, "input entry %d is %s; this call was prepared with %s there", i,
                        in[i].name, pl->name);
        if (in[i].dtype != pl->dtype)
            return fail(TRT_SEER_E_INPUT, "input %s has dtype %s; this call takes %s", pl->name,
                        trt_seer_dtype_name(in[i].dtype), trt_seer_dtype_name(pl->dtype));
        if (in[i].ndim != pl->ndim || memcmp(in[i].shape, pl->shape, sizeof(int64_t) * (size_t)pl->ndim) != 0) {
            char got[256], want[256];
            format_shape(got, sizeof got, in[i].ndim, in[i].shape);
            format_shape(want, sizeof want, pl->ndim, pl->shape);
            return fail(TRT_SEER_E_INPUT, "input %s has shape %s; this call was prepared for %s: prepare another "
                        "call for these shapes, or use trt_seer_run", pl->name, got, want);
        }
    }
    return TRT_SEER_OK;
}

static trt_seer_status match_outputs(const trt_seer_prepared *p, int32_t n, const trt_seer_output *out) {
    if (n != p->n_outputs)
        return fail(TRT_SEER_E_INPUT, "this call was prepared to return %d outputs; got %d entries", p->n_outputs, n);
    for (int32_t i = 0; i < n; ++i) {
        const place *pl = &p->places[p->n_inputs + i];
        if (out[i].name != NULL && strcmp(out[i].name, pl->name) != 0)
            return fail(TRT_SEER_E_INPUT, "output entry %d is %s; this call was prepared to return %s there", i,
                        out[i].name, pl->name);
        if (out[i].capacity_bytes < pl->nbytes) {
            char shape[256];
            format_shape(shape, sizeof shape, pl->ndim, pl->shape);
            return fail(TRT_SEER_E_BUFFER, "output %s is %s%s = %zu bytes; its buffer holds %zu", pl->name,
                        trt_seer_dtype_name(pl->dtype), shape, pl->nbytes, out[i].capacity_bytes);
        }
    }
    return TRT_SEER_OK;
}

trt_seer_status trt_seer_prepared_run(trt_seer_prepared *p, int32_t n_inputs, const trt_seer_input *inputs,
                                      int32_t n_outputs, trt_seer_output *outputs) {
    trt_seer_status st;
    if (p == NULL) return fail(TRT_SEER_E_INPUT, "prepared is NULL");
    if ((st = check_inputs(n_inputs, inputs, 1)) || (st = check_outputs(n_outputs, outputs, 1)) ||
        (st = match_inputs(p, n_inputs, inputs)) || (st = match_outputs(p, n_outputs, outputs)))
        return st;
    if (pthread_mutex_trylock(&p->busy) != 0)
        return fail(TRT_SEER_E_INPUT, "this prepared call is running in another thread; prepare one call per thread");
    for (int32_t i = 0; i < n_inputs; ++i) memcpy(p->places[i].data, inputs[i].data, p->places[i].nbytes);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs(p->run); /* the staged inputs in, the engine, the outputs back */
    st = r ? TRT_SEER_OK : from_exception();
    Py_XDECREF(r);
    PyGILState_Release(g);
    for (int32_t i = 0; st == TRT_SEER_OK && i < n_outputs; ++i) {
        const place *pl = &p->places[n_inputs + i];
        memcpy(outputs[i].data, pl->data, pl->nbytes);
        outputs[i].dtype = pl->dtype;
        outputs[i].ndim = pl->ndim;
        memcpy(outputs[i].shape, pl->shape, sizeof pl->shape);
    }
    pthread_mutex_unlock(&p->busy);
    return done(st);
}

trt_seer_status trt_seer_prepared_close(trt_seer_prepared *p) {
    if (p == NULL) return done(TRT_SEER_OK);
    pthread_mutex_lock(&p->busy); /* a run in flight finishes first */
    pthread_mutex_unlock(&p->busy);
    PyGILState_STATE g = PyGILState_Ensure();
    trt_seer_status st = close_object(p->call);
    free_prepared(p);
    PyGILState_Release(g);
    return done(st);
}

const char *trt_seer_last_error(void) { return last_error; }

const char *trt_seer_dtype_name(trt_seer_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < N_DTYPES ? DTYPE_NAMES[dtype] : "unknown";
}

size_t trt_seer_dtype_size(trt_seer_dtype dtype) {
    return (int)dtype >= 0 && (int)dtype < N_DTYPES ? DTYPE_SIZES[dtype] : 0;
}

size_t trt_seer_output_nbytes(const trt_seer_output *output) {
    return output ? element_count(output->ndim, output->shape) * trt_seer_dtype_size(output->dtype) : 0;
}
