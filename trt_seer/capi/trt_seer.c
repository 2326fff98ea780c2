/* libtrt_seer: the C ABI of trt_seer.h over the Python runtime, embedded.
 *
 * The first call starts one CPython interpreter for the process (or joins the host's, when the
 * library is loaded into a Python process), imports trt_seer.capi.bridge and releases the GIL;
 * each call takes the GIL, wraps the caller's buffers in memoryviews (no copy) and calls the
 * bridge, which calls trt_seer.runtime.load / Model.infer. A prepared call copies inputs into, and
 * outputs out of, the Python call's own memory without the GIL and takes it only for the run.
 * The interpreter is isolated from the host's PYTHON* variables and never finalized. Every model and
 * prepared call has a gate that counts the calls inside it: close waits for them and later calls get
 * TRT_SEER_E_INPUT; the gates outlive their objects (a few bytes each), so a late call reads no freed
 * memory. trt_seer_shutdown (also run at exit) waits for every call in flight and releases everything.
 * trt_seer_run keeps one prepared call per model for a key it sees repeat ("the run cache" below).
 * Build with `python -m trt_seer.capi.build --out DIR`; docs/RUNTIME.md says what this costs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "trt_seer.h"

/* Recorded by build.py: the python executable the library was built for (its path finds its prefix),
 * that prefix and its standard library, and where trt_seer was imported from (searched first for
 * trt_seer itself). */
#ifndef TRT_SEER_PYTHON
#define TRT_SEER_PYTHON ""
#endif
#ifndef TRT_SEER_PREFIX
#define TRT_SEER_PREFIX ""
#endif
#ifndef TRT_SEER_STDLIB
#define TRT_SEER_STDLIB ""
#endif
#ifndef TRT_SEER_PACKAGE_DIR
#define TRT_SEER_PACKAGE_DIR ""
#endif
#ifndef TRT_SEER_SYS_PATH /* the building interpreter's sys.path, os.pathsep-separated */
#define TRT_SEER_SYS_PATH ""
#endif

/* What close and shutdown wait on; never freed, so that a call made during or after a close finds
 * `closed` set instead of freed memory. */
typedef struct gate {
    int inside;        /* calls in flight on this object */
    int closed;
    int prepared;      /* a trt_seer_prepared (released before models at shutdown) */
    struct gate *next; /* every gate, newest first */
} gate;

/* trt_seer_run's prepared call for a repeated key; see "the run cache" below. */
typedef struct {
    pthread_mutex_t lock;    /* guards the fields below; never held while taking the GIL */
    trt_seer_prepared *call; /* NULL: none */
    uint64_t key;            /* the hash of its key */
    int busy;                /* a run is using it, or it is being replaced */
    uint64_t last;           /* the hash of the key of the last run on the plain path */
    uint64_t hits, tries;    /* runs it served; calls made or tried */
    uint64_t kept;           /* calls made (tries that gave one) */
    uint64_t spent_ns;       /* wall time spent making or trying calls */
} run_cache;

struct trt_seer_model {
    gate gate; /* first: a trt_seer_model * is a gate * */
    PyObject *model; /* a trt_seer.capi.bridge.Handle; NULL once closed */
    char backend[32];
    int32_t n_inputs, n_outputs;
    trt_seer_tensor_info *infos; /* inputs, then outputs */
    int64_t (*ids)[2];           /* per input: token ids allowed in [lo, hi); hi -1: any */
    run_cache cache;
};

static const char *const DTYPE_NAMES[] = {"float32", "float16", "bfloat16", "float64", "int64",
                                          "int32", "int8", "uint8", "bool"};
static const size_t DTYPE_SIZES[] = {4, 2, 2, 8, 8, 4, 1, 1, 1};
#define N_DTYPES ((int)(sizeof DTYPE_SIZES / sizeof DTYPE_SIZES[0]))

static _Thread_local char last_error[1024];
static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static PyObject *bridge; /* NULL when the runtime could not start; init_error says why */
static PyObject *bridge_run; /* bridge.run, looked up once: it is called on every trt_seer_run */
static char init_error[1024];
static int own_interpreter; /* started here (not a Python host's) */

static pthread_mutex_t gates_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t gates_changed = PTHREAD_COND_INITIALIZER;
static gate *gates;           /* every model and prepared call ever made */
static int in_flight;         /* calls inside any gate, and closes releasing their object */
static int shut_down;         /* trt_seer_shutdown was called: every call is refused */
static volatile int forked;   /* this is a child forked after the interpreter started */
static pid_t opened_by;

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

/* ------------------------------------------------------------------ gates */

#define FORKED_MESSAGE "this process was forked after trt_seer_open (in process %d); the embedded runtime " \
    "cannot run in a forked child: fork before the first trt_seer_open, or exec a new program"

/* Enters `g` for one call; `exclusive`: refused while another call is inside. */
static trt_seer_status enter(gate *g, int exclusive) {
    if (forked) return fail(TRT_SEER_E_RUNTIME, FORKED_MESSAGE, (int)opened_by);
    trt_seer_status st = TRT_SEER_OK;
    pthread_mutex_lock(&gates_lock);
    if (shut_down)
        st = fail(TRT_SEER_E_INPUT, "trt_seer_shutdown was called; the library takes no more calls");
    else if (g->closed)
        st = fail(TRT_SEER_E_INPUT, g->prepared ? "this prepared call is closed" : "the model is closed");
    else if (exclusive && g->inside)
        st = fail(TRT_SEER_E_INPUT, "this prepared call is running in another thread; prepare one call per thread");
    else
        g->inside++, in_flight++;
    pthread_mutex_unlock(&gates_lock);
    return st;
}

static void leave(gate *g) {
    pthread_mutex_lock(&gates_lock);
    g->inside--, in_flight--;
    if (g->closed || shut_down) pthread_cond_broadcast(&gates_changed); /* only then does anyone wait */
    pthread_mutex_unlock(&gates_lock);
}

static void add_gate(gate *g, int prepared) {
    g->prepared = prepared;
    pthread_mutex_lock(&gates_lock);
    g->next = gates;
    gates = g;
    pthread_mutex_unlock(&gates_lock);
}

/* Closes `g` and waits for the calls inside; 1 when the caller now releases the object (and calls
 * released() after), 0 when it was closed already. */
static int close_gate(gate *g) {
    pthread_mutex_lock(&gates_lock);
    int first = !g->closed;
    g->closed = 1;
    while (g->inside) pthread_cond_wait(&gates_changed, &gates_lock);
    if (first) in_flight++; /* shutdown waits for the release too */
    pthread_mutex_unlock(&gates_lock);
    return first;
}

static void released(void) {
    pthread_mutex_lock(&gates_lock);
    in_flight--;
    pthread_cond_broadcast(&gates_changed);
    pthread_mutex_unlock(&gates_lock);
}

static void after_fork_in_child(void) { forked = 1; }

static void at_exit(void) {
    if (!forked) trt_seer_shutdown();
}

/* Registers at_exit once `backend` has reached `phase` (0 opened, 1 ran), so that it runs before the
 * exit-time destructors its libraries registered by then (exit runs handlers in the reverse order
 * of registration; ONNX Runtime registers some at its first run). */
static volatile int exit_registered; /* a bit per backend and phase */

static void exit_after(const char *backend, int phase) {
    int bit = (strcmp(backend, "tensorrt") == 0 ? 2 : 1) << (2 * phase);
    if (!own_interpreter || (exit_registered & bit)) return;
    pthread_mutex_lock(&gates_lock);
    if (!(exit_registered & bit) && atexit(at_exit) == 0) exit_registered |= bit;
    pthread_mutex_unlock(&gates_lock);
}

/* ------------------------------------------------------------------ starting the interpreter */

static int file_exists(const char *dir, const char *name) {
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s%s", dir, name);
    return stat(path, &st) == 0;
}

/* The Python the library was built for must still be where build.py found it (checked before
 * starting it: a Python that cannot find its standard library prints pages and aborts). */
static int check_python(void) {
    const char *asked = getenv("TRT_SEER_PYTHON");
    if (asked && *asked && strcmp(asked, TRT_SEER_PYTHON) != 0) {
        snprintf(init_error, sizeof init_error, "TRT_SEER_PYTHON=%s names another Python than the one this library "
                 "was built for (%s); unset it, or rebuild the library with that Python (-m trt_seer.capi.build)",
                 asked, TRT_SEER_PYTHON);
        return 0;
    }
    if (!*TRT_SEER_PYTHON || access(TRT_SEER_PYTHON, X_OK) != 0 || !file_exists(TRT_SEER_STDLIB, "/os.py")) {
        snprintf(init_error, sizeof init_error, "the Python this library was built for is gone (%s, standard library "
                 "%s); rebuild the library with the Python the service should use (-m trt_seer.capi.build)",
                 TRT_SEER_PYTHON, TRT_SEER_STDLIB);
        return 0;
    }
    return 1;
}

/* Isolated: PYTHONHOME, PYTHONPATH, PYTHONWARNINGS and the other PYTHON* variables of the service,
 * the user site and the working directory do not reach the embedded runtime. */
static int start_interpreter(void) {
    if (!check_python()) return 0;
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config); /* also: no signal handlers, the service's stdio left alone */
    PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, TRT_SEER_PYTHON);
    if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(st)) {
        snprintf(init_error, sizeof init_error, "cannot start the embedded Python (%s): %s", TRT_SEER_PYTHON,
                 st.err_msg ? st.err_msg : "unknown error");
        return 0;
    }
    own_interpreter = 1;
    return 1;
}

/* GIL held: checks that the started interpreter is the one recorded (its prefix), adds the build's
 * sys.path entries it lacks (PYTHONPATH and user site at build time: the isolated configuration
 * reads neither; a sitecustomize among them runs, as in the building interpreter) and keeps its trt_seer
 * loggers off stderr (logging's last resort); imports trt_seer
 * from the recorded directory ahead of anything else on sys.path, then the bridge. A Python host's
 * interpreter is left as it is. */
static const char START[] =
    "def start(prefix, package_dir, search):\n"
    "    import logging, os, site, sys\n"
    "    if prefix and sys.prefix != prefix:\n"
    "        return f'the embedded Python runs from {sys.prefix}, not {prefix} as built; rebuild the library'\n"
    "    if prefix:  # our own interpreter: the build's extra sys.path entries; no logs to print\n"
    "        for entry in search.split(os.pathsep):\n"
    "            if entry and entry not in sys.path and os.path.isdir(entry):\n"
    "                site.addsitedir(entry) if entry.endswith('-packages') else sys.path.append(entry)\n"
    "        hook = next((os.path.join(e, 'sitecustomize.py') for e in search.split(os.pathsep)\n"
    "                     if e and os.path.isfile(os.path.join(e, 'sitecustomize.py'))), None)\n"
    "        loaded = getattr(sys.modules.get('sitecustomize'), '__file__', None)\n"
    "        if hook and (loaded is None or os.path.realpath(loaded) != os.path.realpath(hook)):\n"
    "            import importlib.util  # the start-up hook the building interpreter ran, which may\n"
    "            spec = importlib.util.spec_from_file_location('sitecustomize', hook)  # shadow the system's\n"
    "            sys.modules['sitecustomize'] = module = importlib.util.module_from_spec(spec)\n"
    "            spec.loader.exec_module(module)\n"
    "        logging.getLogger('trt_seer').addHandler(logging.NullHandler())\n"
    "    if package_dir:\n"
    "        sys.path.insert(0, package_dir)\n"
    "        try:\n"
    "            import trt_seer\n"
    "        finally:\n"
    "            sys.path.remove(package_dir)\n"
    "            sys.path.append(package_dir)\n"
    "    return ''\n";

static void import_bridge(void) {
    PyObject *globals = PyDict_New(), *r = NULL, *why = NULL;
    if (globals && PyDict_SetItemString(globals, "__builtins__", PyEval_GetBuiltins()) == 0)
        r = PyRun_String(START, Py_file_input, globals, globals);
    PyObject *start = r ? PyDict_GetItemString(globals, "start") : NULL; /* borrowed */
    if (start)
        why = PyObject_CallFunction(start, "sss", own_interpreter ? TRT_SEER_PREFIX : "", TRT_SEER_PACKAGE_DIR,
                                    TRT_SEER_SYS_PATH);
    const char *text = why ? PyUnicode_AsUTF8(why) : NULL;
    if (text && *text)
        snprintf(init_error, sizeof init_error, "%s", text);
    else if (text)
        bridge = PyImport_ImportModule("trt_seer.capi.bridge");
    if (bridge && (bridge_run = PyObject_GetAttrString(bridge, "run")) == NULL) Py_CLEAR(bridge);
    if (bridge == NULL && !(text && *text)) {
        char buf[768];
        exception_text(buf, sizeof buf);
        snprintf(init_error, sizeof init_error, "cannot import trt_seer.capi.bridge (%s); install trt_seer and its "
                 "dependencies into the Python this library was built for (%s)", buf, TRT_SEER_PYTHON);
    }
    Py_XDECREF(why);
    Py_XDECREF(r);
    Py_XDECREF(globals);
}

static void init(void) {
    opened_by = getpid();
    if (Py_IsInitialized()) { /* loaded into a Python process: use its interpreter */
        PyGILState_STATE g = PyGILState_Ensure();
        import_bridge();
        PyGILState_Release(g);
    } else {
        if (!start_interpreter()) return;
        import_bridge();
        PyEval_SaveThread(); /* release the GIL: every call takes it with PyGILState_Ensure */
    }
    pthread_atfork(NULL, NULL, after_fork_in_child);
}

static trt_seer_status ready(void) {
    if (forked) return fail(TRT_SEER_E_RUNTIME, FORKED_MESSAGE, (int)opened_by);
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
    PyObject *f = strcmp(fn, "run") == 0 ? Py_NewRef(bridge_run) : PyObject_GetAttrString(bridge, fn);
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

static int fill_info(PyObject *item, trt_seer_tensor_info *info, int64_t *ids) {
    const char *name;
    int code;
    long long lo, hi;
    PyObject *shape, *min, *max;
    if (!PyArg_ParseTuple(item, "siOOOLL", &name, &code, &shape, &min, &max, &lo, &hi)) return 0;
    info->dtype = (trt_seer_dtype)code;
    if (!read_dims(shape, info->shape, &info->ndim) || !read_dims(min, info->min_shape, NULL) ||
        !read_dims(max, info->max_shape, NULL))
        return 0;
    if (ids) ids[0] = lo, ids[1] = hi;
    info->name = strdup(name);
    return info->name != NULL || (PyErr_NoMemory(), 0);
}

/* GIL held: releases the Python model. The struct (its gate) and its descriptions stay: services
 * put the names from trt_seer_input_info into their inputs, which a call racing a close still reads. */
static void release_model(trt_seer_model *m) { Py_CLEAR(m->model); }

static void free_model(trt_seer_model *m) { /* one never handed out */
    for (int32_t i = 0; m->infos && i < m->n_inputs + m->n_outputs; ++i) free((void *)m->infos[i].name);
    free(m->infos);
    free(m->ids);
    Py_XDECREF(m->model);
    pthread_mutex_destroy(&m->cache.lock);
    free(m);
}

/* GIL held: a trt_seer_model around a bridge Handle (steals it), or NULL with an exception set. */
static trt_seer_model *wrap_model(PyObject *py) {
    trt_seer_model *m = calloc(1, sizeof *m);
    if (m == NULL) return (trt_seer_model *)PyErr_NoMemory();
    m->model = py;
    pthread_mutex_init(&m->cache.lock, NULL); /* kept with the struct: destroyed only by free_model */
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
        m->ids = calloc((size_t)m->n_inputs + 1, sizeof *m->ids);
        good = (m->infos != NULL && m->ids != NULL) || (PyErr_NoMemory(), 0);
        for (int32_t i = 0; good && i < m->n_inputs + m->n_outputs; ++i)
            good = i < m->n_inputs ? fill_info(PyList_GET_ITEM(ins, i), &m->infos[i], m->ids[i])
                                   : fill_info(PyList_GET_ITEM(outs, i - m->n_inputs), &m->infos[i], NULL);
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
            return fail(TRT_SEER_E_INPUT, in[i].ndim > 0 && in[i].shape == NULL ? "input %s has ndim %d and no shape"
                        : "input %s has ndim %d; the C ABI takes 0..8", name, in[i].ndim);
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

/* The argument checks of trt_seer_output_shapes and trt_seer_run, then enters the model. */
static trt_seer_status begin_call(trt_seer_model *m, int32_t n_in, const trt_seer_input *in, int32_t n_out,
                                  const trt_seer_output *out, int with_data) {
    trt_seer_status st;
    if (m == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    if ((st = check_inputs(n_in, in, with_data)) || (st = check_outputs(n_out, out, with_data))) return st;
    return enter(&m->gate, 0);
}

/* GIL held: bridge.<fn>(model, names, codes, shapes, [buffers,] out_names, [out_buffers]) -> shapes. */
static trt_seer_status shapes_call(const char *fn, trt_seer_model *m, int32_t n_in, const trt_seer_input *in,
                                   int32_t n_out, trt_seer_output *out, int with_data) {
    trt_seer_status st;
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
    return st;
}

/* ------------------------------------------------------------------ the ABI */

static gate opening; /* never closed: an open in flight counts for shutdown */

trt_seer_status trt_seer_open(const char *path, const char *backend, const char *options_json,
                              trt_seer_model **model) {
    if (model == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    *model = NULL;
    if (path == NULL) return fail(TRT_SEER_E_INPUT, "path is NULL");
    trt_seer_status st = ready();
    if (st != TRT_SEER_OK || (st = enter(&opening, 0))) return st;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *py = call("open_model", Py_BuildValue("(Nss)", PyUnicode_DecodeFSDefault(path),
                                                    backend ? backend : "", options_json ? options_json : ""));
    *model = py ? wrap_model(py) : NULL;
    st = *model ? TRT_SEER_OK : from_exception();
    PyGILState_Release(g);
    if (*model) {
        add_gate(&(*model)->gate, 0);
        exit_after((*model)->backend, 0);
    }
    leave(&opening);
    return done(st);
}

trt_seer_status trt_seer_backend(const trt_seer_model *model, const char **backend) {
    trt_seer_status st;
    if (model == NULL || backend == NULL) return fail(TRT_SEER_E_INPUT, "model or backend is NULL");
    if ((st = enter((gate *)&model->gate, 0))) return st;
    *backend = model->backend;
    leave((gate *)&model->gate);
    return done(TRT_SEER_OK);
}

static trt_seer_status count(const trt_seer_model *model, int32_t *n, int outputs) {
    trt_seer_status st;
    if (model == NULL || n == NULL) return fail(TRT_SEER_E_INPUT, "model or count is NULL");
    if ((st = enter((gate *)&model->gate, 0))) return st;
    *n = outputs ? model->n_outputs : model->n_inputs;
    leave((gate *)&model->gate);
    return done(TRT_SEER_OK);
}

trt_seer_status trt_seer_num_inputs(const trt_seer_model *model, int32_t *n) { return count(model, n, 0); }
trt_seer_status trt_seer_num_outputs(const trt_seer_model *model, int32_t *n) { return count(model, n, 1); }

static trt_seer_status info_at(const trt_seer_model *model, int32_t index, trt_seer_tensor_info *info, int outputs) {
    trt_seer_status st;
    if (model == NULL || info == NULL) return fail(TRT_SEER_E_INPUT, "model or info is NULL");
    if ((st = enter((gate *)&model->gate, 0))) return st;
    int32_t n = outputs ? model->n_outputs : model->n_inputs;
    if (index < 0 || index >= n)
        st = fail(TRT_SEER_E_INPUT, "%s index %d is out of range: the model has %d", outputs ? "output" : "input",
                  index, n);
    else
        *info = model->infos[(outputs ? model->n_inputs : 0) + index];
    leave((gate *)&model->gate);
    return done(st);
}

trt_seer_status trt_seer_input_info(const trt_seer_model *m, int32_t i, trt_seer_tensor_info *info) {
    return info_at(m, i, info, 0);
}

trt_seer_status trt_seer_output_info(const trt_seer_model *m, int32_t i, trt_seer_tensor_info *info) {
    return info_at(m, i, info, 1);
}

trt_seer_status trt_seer_output_shapes(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                                       int32_t n_outputs, trt_seer_output *outputs) {
    trt_seer_status st;
    if ((st = begin_call(model, n_inputs, inputs, n_outputs, outputs, 0))) return st;
    PyGILState_STATE g = PyGILState_Ensure();
    st = shapes_call("output_shapes", model, n_inputs, inputs, n_outputs, outputs, 0);
    PyGILState_Release(g);
    leave(&model->gate);
    return done(st);
}

static uint64_t run_key(const trt_seer_model *m, int32_t n_in, const trt_seer_input *in, int32_t n_out,
                        const trt_seer_output *out);
static int cached_run(trt_seer_model *m, uint64_t key, int32_t n_in, const trt_seer_input *in, int32_t n_out,
                      trt_seer_output *out, trt_seer_status *st);
static void cache_after_run(trt_seer_model *m, uint64_t key, int32_t n_in, const trt_seer_input *in,
                            int32_t n_out, trt_seer_output *out);

/* Through the model's cached prepared call where it takes this call (the run cache, below), else the
 * bridge's run; a plain run that succeeded may make the cached call for its key. */
trt_seer_status trt_seer_run(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                             int32_t n_outputs, trt_seer_output *outputs) {
    trt_seer_status st;
    if ((st = begin_call(model, n_inputs, inputs, n_outputs, outputs, 1))) return st;
    uint64_t key = run_key(model, n_inputs, inputs, n_outputs, outputs);
    if (!cached_run(model, key, n_inputs, inputs, n_outputs, outputs, &st)) {
        PyGILState_STATE g = PyGILState_Ensure();
        st = shapes_call("run", model, n_inputs, inputs, n_outputs, outputs, 1);
        if (st == TRT_SEER_OK) cache_after_run(model, key, n_inputs, inputs, n_outputs, outputs);
        PyGILState_Release(g);
    }
    if (st == TRT_SEER_OK) exit_after(model->backend, 1);
    leave(&model->gate);
    return done(st);
}

/* GIL held: obj.close(), its failure as a status. */
static trt_seer_status close_object(PyObject *obj) {
    PyObject *r = PyObject_CallMethod(obj, "close", NULL);
    trt_seer_status st = r ? TRT_SEER_OK : from_exception();
    Py_XDECREF(r);
    return st;
}

static trt_seer_status close_cached(trt_seer_model *m);

trt_seer_status trt_seer_close(trt_seer_model *model) {
    if (model == NULL) return done(TRT_SEER_OK);
    if (forked) return fail(TRT_SEER_E_RUNTIME, FORKED_MESSAGE, (int)opened_by);
    if (!close_gate(&model->gate)) return done(TRT_SEER_OK); /* closed already (or by trt_seer_shutdown) */
    PyGILState_STATE g = PyGILState_Ensure();
    trt_seer_status st = close_cached(model), closed = close_object(model->model);
    if (closed != TRT_SEER_OK) st = closed; /* the later failure's message is the one kept */
    release_model(model);
    PyGILState_Release(g);
    released();
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
    int64_t ids[2]; /* inputs: token ids allowed in [lo, hi); hi -1: any value */
} place;

struct trt_seer_prepared {
    gate gate; /* first: a trt_seer_prepared * is a gate * */
    const char *backend; /* its model's */
    PyObject *call, *run; /* the Python PreparedCall and its bound run(); NULL once closed */
    int32_t n_inputs, n_outputs;
    place *places; /* inputs, then outputs */
};

/* GIL held: releases what the call holds; the struct itself (its gate) stays. */
static void release_prepared(trt_seer_prepared *p) {
    for (int32_t i = 0; p->places && i < p->n_inputs + p->n_outputs; ++i) free(p->places[i].name);
    free(p->places);
    p->places = NULL;
    Py_CLEAR(p->run);
    Py_CLEAR(p->call);
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
    pl->ids[0] = 0, pl->ids[1] = -1;
    return pl->name != NULL || (PyErr_NoMemory(), 0);
}

/* GIL held: the call and its places from bridge.prepare's (call, [(address, bytes)],
 * [(name, dtype code, shape, address, bytes)]); sets the output entries' dtype and shape (`out` NULL:
 * none). */
static int read_places(trt_seer_prepared *p, PyObject *r, const trt_seer_model *m, const trt_seer_input *in,
                       trt_seer_output *out) {
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
        for (int32_t k = 0; k < m->n_inputs; ++k)
            if (strcmp(m->infos[k].name, in[i].name) == 0) memcpy(p->places[i].ids, m->ids[k], sizeof m->ids[k]);
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
        if (out == NULL) continue;
        out[i].dtype = pl->dtype;
        out[i].ndim = pl->ndim;
        memcpy(out[i].shape, pl->shape, sizeof pl->shape);
    }
    return 1;
}

/* GIL held: bridge.<fn>(model, names, codes, shapes, out_names) into `p`; 0 with an exception set, or
 * with none where the bridge returned None (prepare_for_run: not for this key). */
static int prepare_call(const char *fn, trt_seer_prepared *p, trt_seer_model *m, const trt_seer_input *in,
                        trt_seer_output *out, int set_outputs) {
    PyObject *ins = input_lists(p->n_inputs, in, 0);
    PyObject *outs = ins ? output_lists(p->n_outputs, out, 0) : NULL, *r = NULL;
    if (ins && outs)
        r = call(fn, Py_BuildValue("(OOOOO)", m->model, PyTuple_GET_ITEM(ins, 0), PyTuple_GET_ITEM(ins, 1),
                                   PyTuple_GET_ITEM(ins, 2), PyTuple_GET_ITEM(outs, 0)));
    int good = r != NULL && r != Py_None && read_places(p, r, m, in, set_outputs ? out : NULL);
    Py_XDECREF(r);
    Py_XDECREF(ins);
    Py_XDECREF(outs);
    return good;
}

/* GIL held: frees a call never handed out (no gate to keep), closing its Python call first; an
 * exception set stays set (the first failure is the one reported). */
static void discard_prepared(trt_seer_prepared *p) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *closed = p->call ? PyObject_CallMethod(p->call, "close", NULL) : Py_NewRef(Py_None);
    if (closed == NULL) PyErr_Clear();
    Py_XDECREF(closed);
    PyErr_Restore(type, value, tb);
    release_prepared(p);
    free(p);
}

/* GIL held: a prepared call of `m` made by bridge.<fn> (see prepare_call), or NULL; `set_outputs`:
 * also set the output entries' dtype and shape. */
static trt_seer_prepared *new_prepared(const char *fn, trt_seer_model *m, int32_t n_in, const trt_seer_input *in,
                                       int32_t n_out, trt_seer_output *out, int set_outputs) {
    trt_seer_prepared *p = calloc(1, sizeof *p);
    if (p == NULL || (p->places = calloc((size_t)(n_in + n_out) + 1, sizeof *p->places)) == NULL) {
        free(p);
        return (trt_seer_prepared *)PyErr_NoMemory();
    }
    p->n_inputs = n_in;
    p->n_outputs = n_out;
    p->backend = m->backend;
    if (prepare_call(fn, p, m, in, out, set_outputs)) return p;
    discard_prepared(p);
    return NULL;
}

trt_seer_status trt_seer_prepare(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                                 int32_t n_outputs, trt_seer_output *outputs, trt_seer_prepared **prepared) {
    trt_seer_status st;
    if (prepared == NULL) return fail(TRT_SEER_E_INPUT, "prepared is NULL");
    *prepared = NULL;
    if (model == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    if ((st = check_inputs(n_inputs, inputs, 0)) || (st = check_outputs(n_outputs, outputs, 0))) return st;
    if ((st = enter(&model->gate, 0))) return st;
    PyGILState_STATE g = PyGILState_Ensure();
    trt_seer_prepared *p = new_prepared("prepare", model, n_inputs, inputs, n_outputs, outputs, 1);
    st = p ? TRT_SEER_OK : from_exception();
    PyGILState_Release(g);
    leave(&model->gate);
    if (p) {
        add_gate(&p->gate, 1);
        *prepared = p;
    }
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

/* Whether C checks this input's token ids (check_ids): it has a bound and an integer type C reads. */
static int ids_checked(const place *pl) {
    return pl->ids[1] >= 0 && (pl->dtype == TRT_SEER_INT64 || pl->dtype == TRT_SEER_INT32);
}

static size_t count_of(const place *pl) { return pl->nbytes / DTYPE_SIZES[pl->dtype]; }

/* The flat index of the first token id outside the input's bounds; count_of(pl) when none is. */
static size_t first_bad_id(const place *pl, const void *data) {
    size_t n = count_of(pl);
    if (!ids_checked(pl)) return n;
    for (size_t k = 0; k < n; ++k) {
        int64_t v = pl->dtype == TRT_SEER_INT64 ? ((const int64_t *)data)[k] : ((const int32_t *)data)[k];
        if (v < pl->ids[0] || v >= pl->ids[1]) return k;
    }
    return n;
}

/* A token input's values, before anything is copied: the same rule and message as Python's. */
static trt_seer_status check_ids(const place *pl, const void *data) {
    size_t k = first_bad_id(pl, data);
    if (k == count_of(pl)) return TRT_SEER_OK;
    int64_t v = pl->dtype == TRT_SEER_INT64 ? ((const int64_t *)data)[k] : ((const int32_t *)data)[k];
    int64_t at[TRT_SEER_MAX_DIMS];
    size_t rest = k;
    for (int32_t d = pl->ndim - 1; d >= 0; --d) { /* the flat index as [i, j, ...] */
        at[d] = (int64_t)(rest % (size_t)pl->shape[d]);
        rest /= (size_t)pl->shape[d];
    }
    char where[256];
    format_shape(where, sizeof where, pl->ndim, at);
    if (v < pl->ids[0])
        return fail(TRT_SEER_E_INPUT, "input %s holds %lld at %s; token ids are never negative", pl->name,
                    (long long)v, where);
    return fail(TRT_SEER_E_INPUT, "input %s holds %lld at %s; the model's table has %lld ids (%lld..%lld): "
                "tokenize with the model's own tokenizer", pl->name, (long long)v, where,
                (long long)pl->ids[1], (long long)pl->ids[0], (long long)pl->ids[1] - 1);
}

static trt_seer_status check_prepared_run(const trt_seer_prepared *p, int32_t n_inputs, const trt_seer_input *inputs,
                                          int32_t n_outputs, const trt_seer_output *outputs) {
    trt_seer_status st;
    if ((st = match_inputs(p, n_inputs, inputs)) || (st = match_outputs(p, n_outputs, outputs))) return st;
    for (int32_t i = 0; i < n_inputs; ++i)
        if ((st = check_ids(&p->places[i], inputs[i].data))) return st;
    return TRT_SEER_OK;
}

/* A checked run of `p` (one thread at a time): the inputs copied into its memory, the Python call with
 * the GIL, its outputs copied into the caller's buffers. */
static trt_seer_status run_places(trt_seer_prepared *p, const trt_seer_input *inputs, trt_seer_output *outputs) {
    for (int32_t i = 0; i < p->n_inputs; ++i) memcpy(p->places[i].data, inputs[i].data, p->places[i].nbytes);
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallNoArgs(p->run); /* the staged inputs in, the engine, the outputs back */
    trt_seer_status st = r ? TRT_SEER_OK : from_exception();
    Py_XDECREF(r);
    PyGILState_Release(g);
    for (int32_t i = 0; st == TRT_SEER_OK && i < p->n_outputs; ++i) {
        const place *pl = &p->places[p->n_inputs + i];
        memcpy(outputs[i].data, pl->data, pl->nbytes);
        outputs[i].dtype = pl->dtype;
        outputs[i].ndim = pl->ndim;
        memcpy(outputs[i].shape, pl->shape, sizeof pl->shape);
    }
    return st;
}

trt_seer_status trt_seer_prepared_run(trt_seer_prepared *p, int32_t n_inputs, const trt_seer_input *inputs,
                                      int32_t n_outputs, trt_seer_output *outputs) {
    trt_seer_status st;
    if (p == NULL) return fail(TRT_SEER_E_INPUT, "prepared is NULL");
    if ((st = check_inputs(n_inputs, inputs, 1)) || (st = check_outputs(n_outputs, outputs, 1))) return st;
    if ((st = enter(&p->gate, 1))) return st;
    if ((st = check_prepared_run(p, n_inputs, inputs, n_outputs, outputs)) == TRT_SEER_OK &&
        (st = run_places(p, inputs, outputs)) == TRT_SEER_OK)
        exit_after(p->backend, 1);
    leave(&p->gate);
    return done(st);
}

trt_seer_status trt_seer_prepared_close(trt_seer_prepared *p) {
    if (p == NULL) return done(TRT_SEER_OK);
    if (forked) return fail(TRT_SEER_E_RUNTIME, FORKED_MESSAGE, (int)opened_by);
    if (!close_gate(&p->gate)) return done(TRT_SEER_OK); /* closed already (or by trt_seer_shutdown) */
    PyGILState_STATE g = PyGILState_Ensure();
    trt_seer_status st = close_object(p->call);
    release_prepared(p);
    PyGILState_Release(g);
    released();
    return done(st);
}

/* ------------------------------------------------------------------ the run cache
 *
 * Services call trt_seer_run with the same inputs' names, dtypes and shapes and the same outputs over
 * and over, and the plain path pays for that every time: memoryviews over every buffer, the bridge's
 * lookups and numpy views, in an embedded interpreter that runs Python 1.3-1.9x slower than the python
 * executable. So each model keeps one prepared call, made by the plain path after the second
 * consecutive successful run of one key (the inputs' names, dtypes and shapes in order; the outputs'
 * names, a NULL name resolved by index), and later runs of exactly that key use it when no other
 * thread does (else they take the plain path): the inputs copied in C, one Python call, the outputs
 * copied out in C, as trt_seer_prepared_run does. Its checks are trt_seer_run's: the key is one the
 * plain path accepted, and the buffer sizes and token ids are checked in C before anything is copied;
 * where one fails, the plain path runs and reports it in its own words. One call per model bounds the
 * memory: on TensorRT it has an execution context of its own. Making one costs little on ONNX Runtime
 * (one run on zeros) but, on TensorRT, a context, pinned and device buffers for the profile's largest
 * shapes and, on TensorRT-RTX, the new context's first runs: tens of milliseconds, paid by the run that
 * makes it (the second of its key) and the first runs through it. So a call for another key replaces it
 * only once the cached calls have served REPAY runs for each call made or tried AND REPAY_NS of saving
 * per run has paid back the wall time every making took (on TensorRT the second rule is the binding
 * one: thousands of runs), so keys that take turns cannot make a call every few runs; a try that fails
 * (no GPU memory for one more context; an output whose shape only the run gives) thus turns the cache
 * off until then, which is for good when nothing was cached yet. trt_seer_run_cache_stats reports the
 * counts. trt_seer_close and trt_seer_shutdown release the call after the calls in flight.
 */
#define REPAY 100
#define REPAY_NS 20000ULL /* what a cached run saves at least (25-50 us measured, CPU and H200) */

/* The name trt_seer_run gives output entry i: its own, or by index the model's; NULL: none. */
static const char *output_name(const trt_seer_model *m, const trt_seer_output *out, int32_t i) {
    if (out[i].name) return out[i].name;
    return i < m->n_outputs ? m->infos[m->n_inputs + i].name : NULL;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static uint64_t mix(uint64_t h, const void *data, size_t n) { /* FNV-1a */
    for (size_t i = 0; i < n; ++i) h = (h ^ ((const unsigned char *)data)[i]) * 1099511628211ULL;
    return h;
}

/* A hash of the call's key (never 0, the cache's "none"); equal keys are compared in full (same_key). */
static uint64_t run_key(const trt_seer_model *m, int32_t n_in, const trt_seer_input *in, int32_t n_out,
                        const trt_seer_output *out) {
    uint64_t h = mix(14695981039346656037ULL, &n_in, sizeof n_in);
    for (int32_t i = 0; i < n_in; ++i) {
        h = mix(h, in[i].name, strlen(in[i].name) + 1);
        h = mix(h, &in[i].dtype, sizeof in[i].dtype);
        h = mix(h, &in[i].ndim, sizeof in[i].ndim);
        h = mix(h, in[i].shape, sizeof(int64_t) * (size_t)in[i].ndim);
    }
    h = mix(h, &n_out, sizeof n_out);
    for (int32_t i = 0; i < n_out; ++i) {
        const char *name = output_name(m, out, i);
        h = name ? mix(h, name, strlen(name) + 1) : mix(h, "\1", 1);
    }
    return h ? h : 1;
}

/* Whether `p` was made for exactly this call's key. */
static int same_key(const trt_seer_model *m, const trt_seer_prepared *p, int32_t n_in, const trt_seer_input *in,
                    int32_t n_out, const trt_seer_output *out) {
    if (n_in != p->n_inputs || n_out != p->n_outputs) return 0;
    for (int32_t i = 0; i < n_in; ++i) {
        const place *pl = &p->places[i];
        if (strcmp(in[i].name, pl->name) != 0 || in[i].dtype != pl->dtype || in[i].ndim != pl->ndim ||
            (pl->ndim > 0 && memcmp(in[i].shape, pl->shape, sizeof(int64_t) * (size_t)pl->ndim) != 0))
            return 0;
    }
    for (int32_t i = 0; i < n_out; ++i) {
        const char *name = output_name(m, out, i);
        if (name == NULL || strcmp(name, p->places[n_in + i].name) != 0) return 0;
    }
    return 1;
}

/* trt_seer_run's checks that the key does not settle: every buffer large enough, every token id in range. */
static int fits(const trt_seer_prepared *p, const trt_seer_input *in, const trt_seer_output *out) {
    for (int32_t i = 0; i < p->n_outputs; ++i)
        if (out[i].capacity_bytes < p->places[p->n_inputs + i].nbytes) return 0;
    for (int32_t i = 0; i < p->n_inputs; ++i)
        if (first_bad_id(&p->places[i], in[i].data) != count_of(&p->places[i])) return 0;
    return 1;
}

/* Inside the model: runs the call through the cached prepared call where it takes it (1, *st set);
 * 0 where the plain path must run it. */
static int cached_run(trt_seer_model *m, uint64_t key, int32_t n_in, const trt_seer_input *in, int32_t n_out,
                      trt_seer_output *out, trt_seer_status *st) {
    run_cache *c = &m->cache;
    pthread_mutex_lock(&c->lock);
    trt_seer_prepared *p = c->call;
    if (p == NULL || c->busy || c->key != key || !same_key(m, p, n_in, in, n_out, out)) p = NULL;
    else c->busy = 1;
    pthread_mutex_unlock(&c->lock);
    if (p == NULL) return 0;
    int ran = fits(p, in, out);
    if (ran) *st = run_places(p, in, out);
    pthread_mutex_lock(&c->lock);
    c->busy = 0;
    c->hits += ran && *st == TRT_SEER_OK;
    pthread_mutex_unlock(&c->lock);
    return ran;
}

/* GIL held: frees a cached call, closing its Python call with bridge.release (which logs a failure: the
 * run replacing it has succeeded). */
static void drop_cached(trt_seer_prepared *p) {
    PyObject *r = call("release", Py_BuildValue("(O)", p->call));
    if (r == NULL) PyErr_Clear(); /* bridge.release raises nothing; only building its arguments can fail */
    Py_XDECREF(r);
    release_prepared(p);
    free(p);
}

/* Whether C checks every token input of `p` (fits relies on it; the plain path checks any type). */
static int checks_all_ids(const trt_seer_prepared *p) {
    for (int32_t i = 0; i < p->n_inputs; ++i)
        if (p->places[i].ids[1] >= 0 && !ids_checked(&p->places[i])) return 0;
    return 1;
}

/* GIL held, inside the model, after a plain run of `key` succeeded: makes the model's cached call for
 * `key` when the plain run before was of the same key and the rules above allow one. */
static void cache_after_run(trt_seer_model *m, uint64_t key, int32_t n_in, const trt_seer_input *in, int32_t n_out,
                            trt_seer_output *out) {
    run_cache *c = &m->cache;
    pthread_mutex_lock(&c->lock);
    int make = c->last == key && !c->busy && !(c->call && c->key == key) && c->hits >= REPAY * c->tries &&
               c->hits * REPAY_NS >= c->spent_ns;
    trt_seer_prepared *old = c->call;
    c->last = key;
    if (make) c->busy = 1, c->call = NULL, c->tries++;
    pthread_mutex_unlock(&c->lock);
    if (!make) return;
    uint64_t start = now_ns();
    if (old) drop_cached(old);
    trt_seer_prepared *p = new_prepared("prepare_for_run", m, n_in, in, n_out, out, 0);
    if (p && !checks_all_ids(p)) drop_cached(p), p = NULL;
    /* The bridge logs its own failures and returns None; what is left (no memory for the C side) must
     * not fail a run that has written its outputs: the cache stays empty. */
    if (p == NULL) PyErr_Clear();
    uint64_t spent = now_ns() - start;
    pthread_mutex_lock(&c->lock);
    c->call = p;
    c->key = key;
    c->busy = 0;
    c->kept += p != NULL;
    c->spent_ns += spent;
    pthread_mutex_unlock(&c->lock);
}

trt_seer_status trt_seer_run_cache_stats(trt_seer_model *model, uint64_t *served, uint64_t *made, uint64_t *tried) {
    if (model == NULL) return fail(TRT_SEER_E_INPUT, "model is NULL");
    run_cache *c = &model->cache; /* the struct outlives trt_seer_close: readable after it */
    pthread_mutex_lock(&c->lock);
    if (served) *served = c->hits;
    if (made) *made = c->kept;
    if (tried) *tried = c->tries;
    pthread_mutex_unlock(&c->lock);
    return done(TRT_SEER_OK);
}

/* GIL held, no call inside the model (closed): releases its cached call; the failure of its close. */
static trt_seer_status close_cached(trt_seer_model *m) {
    trt_seer_prepared *p = m->cache.call;
    m->cache.call = NULL;
    if (p == NULL) return TRT_SEER_OK;
    trt_seer_status st = close_object(p->call);
    release_prepared(p);
    free(p);
    return st;
}

/* ------------------------------------------------------------------ shutdown */

trt_seer_status trt_seer_shutdown(void) {
    if (forked) return fail(TRT_SEER_E_RUNTIME, FORKED_MESSAGE, (int)opened_by);
    pthread_mutex_lock(&gates_lock);
    shut_down = 1;
    while (in_flight) pthread_cond_wait(&gates_changed, &gates_lock);
    size_t n = 0, k = 0;
    for (gate *g = gates; g; g = g->next) n += !g->closed;
    gate **left = n ? calloc(n, sizeof *left) : NULL;
    for (gate *g = gates; g && left; g = g->next)
        if (!g->closed) g->closed = 1, left[k++] = g;
    in_flight++; /* a second shutdown waits for this one's releases */
    pthread_mutex_unlock(&gates_lock);
    if (k) {
        PyGILState_STATE g = PyGILState_Ensure();
        for (int pass = 1; pass >= 0; --pass) /* prepared calls before their models */
            for (size_t i = 0; i < k; ++i) {
                if (left[i]->prepared != pass) continue;
                PyObject *obj = pass ? ((trt_seer_prepared *)left[i])->call : ((trt_seer_model *)left[i])->model;
                if (!pass && close_cached((trt_seer_model *)left[i]) != TRT_SEER_OK) last_error[0] = '\0'; /* as below */
                if (close_object(obj) != TRT_SEER_OK) last_error[0] = '\0'; /* shutting down: nothing to tell */
                if (pass) release_prepared((trt_seer_prepared *)left[i]);
                else release_model((trt_seer_model *)left[i]);
            }
        PyGILState_Release(g);
    }
    free(left);
    released();
    return done(TRT_SEER_OK);
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
