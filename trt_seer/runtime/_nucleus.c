/* runtime/sampling.py's top-p draw for float32 logits, compiled: one row at a time, each row's
 * weights computed once into a row-sized work buffer (it stays in cache) and read again only for
 * the candidates' tests, instead of numpy's passes over the whole batch.
 *
 *   _nucleus.draw(logits, uniforms, scale, top_p, work, cum, out)
 *
 * logits (batch, vocab) float32, uniforms (batch, draws) float32, both C-contiguous; scale =
 * log2(e) / temperature; work (vocab,) float32 and cum (blocks,) float64 scratch; out (batch,)
 * int64 receives per row the token, -1 when no draw fell inside the nucleus (the caller's exact
 * fallback) or -2 when a logit is NaN or +inf, or all are -inf (the caller's numpy path). The rule is sampling.py's: weights exp2((logit - best) * scale), candidate j the
 * first token whose running weight in id order exceeds u_j times the row's total (a scan over
 * BLOCK-token block sums, then inside one block), kept when the tokens strictly likelier than it
 * weigh less than top_p of the total. Built with -O3 -ffast-math (setup.py): the loops below are
 * vectorized, and target_clones gives each one an AVX-512, an AVX2 and a baseline body, picked at
 * load for the CPU at hand.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 256 /* tokens per block of the running weight */

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* 2^x for x <= 0 (0 below about -126.5, -inf included): 2^round(x) times a degree-7 Taylor polynomial of
 * 2^f on f in (-0.5, 0.5] (relative error below 4e-9 before float32 rounding). Branch-free, so
 * the loops that call it vectorize. */
static inline __attribute__((always_inline)) float exp2_neg(float x) {
    x = fmaxf(x, -127.0f); /* 2^-127 is built from exponent bits 0: zero */
    int32_t i = (int32_t)(x - 0.5f); /* truncation toward zero: round to nearest for x <= 0 */
    float f = x - (float)i;
    float p = 1.5252734e-05f;
    p = p * f + 1.5403530e-04f;
    p = p * f + 1.3333558e-03f;
    p = p * f + 9.6181291e-03f;
    p = p * f + 5.5504109e-02f;
    p = p * f + 2.4022651e-01f;
    p = p * f + 6.9314718e-01f;
    p = p * f + 1.0f;
    uint32_t bits = (uint32_t)(i + 127) << 23;
    float two_i;
    memcpy(&two_i, &bits, sizeof two_i);
    return p * two_i;
}

/* The row's best logit; *bad set when a logit is NaN or +inf (told by its bits: -ffast-math lets
 * the compiler assume neither). -inf is a logit like another: weight 0. */
CLONES static float row_max(const float *x, Py_ssize_t n, int *bad) {
    float m = -INFINITY;
    uint32_t worst = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &x[i], sizeof bits);
        uint32_t magnitude = bits & 0x7fffffffu;
        worst |= (magnitude > 0x7f800000u) | (bits == 0x7f800000u);
        m = fmaxf(m, x[i]);
    }
    *bad = worst != 0;
    return m;
}

/* e = exp2((x - best) * scale); cum[b] = the running sum of the block sums, in double. */
CLONES static void weigh(const float *x, float *e, Py_ssize_t n, float best, float scale, double *cum) {
    double run = 0.0;
    for (Py_ssize_t start = 0, b = 0; start < n; start += BLOCK, b++) {
        Py_ssize_t end = start + BLOCK < n ? start + BLOCK : n;
        float sum = 0.0f;
        for (Py_ssize_t i = start; i < end; i++) {
            float w = exp2_neg((x[i] - best) * scale);
            e[i] = w;
            sum += w;
        }
        run += sum;
        cum[b] = run;
    }
}

/* The weight of the tokens strictly likelier than weight w (block sums in float, their sum in double). */
CLONES static double likelier(const float *e, Py_ssize_t n, float w) {
    double total = 0.0;
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        Py_ssize_t end = start + BLOCK < n ? start + BLOCK : n;
        float sum = 0.0f;
        for (Py_ssize_t i = start; i < end; i++) sum += e[i] > w ? e[i] : 0.0f;
        total += sum;
    }
    return total;
}

/* The first token whose running weight (id order) exceeds target. */
static Py_ssize_t invert(const float *e, Py_ssize_t n, const double *cum, Py_ssize_t blocks, double target) {
    Py_ssize_t b = 0;
    while (b < blocks - 1 && cum[b] <= target) b++;
    double run = b ? cum[b - 1] : 0.0;
    Py_ssize_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n;
    for (Py_ssize_t i = b * BLOCK; i < end; i++) {
        run += e[i];
        if (run > target) return i;
    }
    return end - 1;
}

static int finite_positive(double v) { /* by its bits: -ffast-math lets the compiler assume no NaN */
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return ((bits >> 52) & 0x7ff) != 0x7ff && !(bits >> 63) && bits != 0;
}

static void draw_rows(const float *logits, const float *u, Py_ssize_t batch, Py_ssize_t n, Py_ssize_t draws,
                      float scale, double top_p, float *e, double *cum, int64_t *out) {
    Py_ssize_t blocks = (n + BLOCK - 1) / BLOCK;
    for (Py_ssize_t r = 0; r < batch; r++) {
        const float *x = logits + r * n;
        int bad;
        float best = row_max(x, n, &bad);
        if (bad) {
            out[r] = -2;
            continue;
        }
        weigh(x, e, n, best, scale, cum);
        double total = cum[blocks - 1];
        out[r] = finite_positive(total) ? -1 : -2; /* not finite: every logit -inf */
        for (Py_ssize_t j = 0; j < draws && out[r] == -1; j++) {
            Py_ssize_t t = invert(e, n, cum, blocks, (double)u[r * draws + j] * total);
            if (top_p >= 1.0 || likelier(e, n, e[t]) < top_p * total) out[r] = t;
        }
    }
}

static int get(PyObject *obj, Py_buffer *view, int flags, const char *format, int ndim, const char *name) {
    if (PyObject_GetBuffer(obj, view, flags | PyBUF_FORMAT | PyBUF_C_CONTIGUOUS) < 0) return -1;
    const char *f = view->format[0] == '<' || view->format[0] == '=' ? view->format + 1 : view->format;
    int same = strcmp(f, format) == 0 || (format[0] == 'q' && strcmp(f, "l") == 0 && view->itemsize == 8);
    if (view->ndim != ndim || !same) {
        PyErr_Format(PyExc_ValueError, "%s: a C-contiguous %d-D array of format '%s' is needed", name, ndim, format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *draw(PyObject *self, PyObject *args) {
    PyObject *objs[5];
    float scale;
    double top_p;
    if (!PyArg_ParseTuple(args, "OOfdOOO", &objs[0], &objs[1], &scale, &top_p, &objs[2], &objs[3], &objs[4]))
        return NULL;
    static const char *names[] = {"logits", "uniforms", "work", "cum", "out"};
    static const char *formats[] = {"f", "f", "f", "d", "q"}; /* q: int64 ("l" where long has 8 bytes) */
    static const int ndims[] = {2, 2, 1, 1, 1};
    static const int writable[] = {0, 0, 1, 1, 1};
    Py_buffer v[5];
    int got = 0;
    for (; got < 5; got++)
        if (get(objs[got], &v[got], writable[got] ? PyBUF_WRITABLE : 0, formats[got], ndims[got], names[got]) < 0)
            break;
    PyObject *result = NULL;
    if (got == 5) {
        Py_ssize_t batch = v[0].shape[0], n = v[0].shape[1], draws = v[1].shape[1];
        if (v[1].shape[0] != batch || v[4].shape[0] != batch || v[2].shape[0] < n
            || v[3].shape[0] < (n + BLOCK - 1) / BLOCK || n < 1 || draws < 1 || v[0].itemsize != 4
            || v[4].itemsize != 8)
            PyErr_SetString(PyExc_ValueError, "draw: shapes do not match (batch, vocab) logits");
        else {
            Py_BEGIN_ALLOW_THREADS
            draw_rows(v[0].buf, v[1].buf, batch, n, draws, scale, top_p, v[2].buf, v[3].buf, v[4].buf);
            Py_END_ALLOW_THREADS
            result = Py_NewRef(Py_None);
        }
    }
    while (got-- > 0) PyBuffer_Release(&v[got]);
    return result;
}

static PyMethodDef methods[] = {
    {"draw", draw, METH_VARARGS, "draw(logits, uniforms, scale, top_p, work, cum, out): see the module's source"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nucleus", "runtime/sampling.py's compiled top-p draw",
                                    -1, methods};

PyMODINIT_FUNC PyInit__nucleus(void) { return PyModule_Create(&module); }
