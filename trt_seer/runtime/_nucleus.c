/* runtime/sampling.py's draws for float32 logits, compiled: one row at a time, the row's work kept
 * in row-sized buffers that stay in cache, instead of numpy's passes over the whole batch.
 *
 *   _nucleus.draw(logits, uniforms, scale, top_p, work, cum, out)          temperature and top-p
 *   _nucleus.top_k(logits, u0, inverse, k, top_p, scaled, maxima, candidates, out)
 *
 * logits (batch, vocab) float32, uniforms (batch, draws) and u0 (batch,) float32, all C-contiguous;
 * scale = log2(e) / temperature, inverse = 1 / temperature; the rest scratch of the vocabulary's
 * size (cum: one double per block); out (batch,) int64 receives per row the token, -1 when no draw
 * fell inside the nucleus (the caller's exact fallback) or -2 when a logit is NaN or +inf, or all
 * are -inf (the caller's numpy path). The rules are sampling.py's. Top-p: weights
 * exp2((logit - best) * scale); candidate j the first token whose running weight in id order
 * exceeds u_j times the row's total (a scan over BLOCK-token block sums, then inside one block),
 * kept when the tokens strictly likelier than it weigh less than top_p of the total. Built with
 * -O3 -ffast-math (setup.py): the loops below vectorize, and target_clones gives each one an
 * AVX-512, an AVX2 and a baseline body, picked at load for the CPU at hand. -ffast-math lets the
 * compiler assume no NaN or infinity, so those are told by their bits.
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
#if defined(__GNUC__)
#define INLINE static inline __attribute__((always_inline))
#else
#define INLINE static inline
#endif

INLINE float exp2_neg(float x) {
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

/* 1 where v is NaN or +inf, told by its bits (-ffast-math lets the compiler assume neither); 0 else. */
INLINE uint32_t nan_or_pos_inf(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return ((bits & 0x7fffffffu) > 0x7f800000u) | (bits == 0x7f800000u);
}

/* The row's best logit; *bad set when a logit is NaN or +inf. -inf is a logit like another: weight 0. */
CLONES static float row_max(const float *x, Py_ssize_t n, int *bad) {
    float m = -INFINITY;
    uint32_t worst = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        worst |= nan_or_pos_inf(x[i]);
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

/* The first token whose running weight (id order) exceeds target; where none inside the block does
 * (its float sum above the running sum of its weights in double), the block's last token with weight. */
static Py_ssize_t invert(const float *e, Py_ssize_t n, const double *cum, Py_ssize_t blocks, double target) {
    Py_ssize_t b = 0;
    while (b < blocks - 1 && cum[b] <= target) b++;
    double run = b ? cum[b - 1] : 0.0;
    Py_ssize_t end = (b + 1) * BLOCK < n ? (b + 1) * BLOCK : n, last = b * BLOCK;
    for (Py_ssize_t i = b * BLOCK; i < end; i++) {
        run += e[i];
        last = e[i] > 0.0f ? i : last;
        if (run > target) return i;
    }
    return last;
}

static int is_neg_inf(float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return bits == 0xff800000u;
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

/* Top-k: per row the k highest scores (logit * inverse; ties: the lower id first), their
 * probabilities exp(score - highest), the smallest head holding top_p of them (the first always
 * kept) and the inverse CDF at u_0 over it: sampling.py's _top_k. Only the tokens at or above a
 * bound are sorted: the k-th highest of the maxima of about 4k blocks of the row, which is at most
 * the k-th highest score (the k blocks' maxima reach it), so about k tokens. */
typedef struct {
    float v;
    int32_t id;
} Cand;

static int by_score(const void *a, const void *b) {
    const Cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* The k-th highest of m values (1 <= k <= m), reordering them. */
static float kth_highest(float *a, Py_ssize_t m, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = m - 1, want = k - 1;
    while (lo < hi) {
        float pivot = a[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] > pivot) i++;
            while (a[j] < pivot) j--;
            if (i <= j) {
                float t = a[i];
                a[i++] = a[j];
                a[j--] = t;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else return a[want];
    }
    return a[want];
}

CLONES static int scale_row(const float *x, float *s, Py_ssize_t n, float inverse) {
    uint32_t worst = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        s[i] = x[i] * inverse;
        worst |= nan_or_pos_inf(s[i]); /* the score's: a finite logit may scale to +inf; numpy's path */
    }
    return worst != 0;
}

CLONES static void block_maxima(const float *s, Py_ssize_t blocks, Py_ssize_t len, float *best) {
    for (Py_ssize_t b = 0; b < blocks; b++) {
        float m = -INFINITY;
        for (Py_ssize_t i = b * len; i < (b + 1) * len; i++) m = fmaxf(m, s[i]);
        best[b] = m;
    }
}

static int64_t top_k_row(const float *x, Py_ssize_t n, float inverse, Py_ssize_t k, double top_p, float u,
                         float *s, float *best, Cand *cand) {
    if (scale_row(x, s, n, inverse)) return -2;
    Py_ssize_t len = n / (4 * k) < BLOCK ? n / (4 * k) : BLOCK;
    len = len < 1 ? 1 : len;
    Py_ssize_t blocks = n / len;
    block_maxima(s, blocks, len, best);
    float *order = (float *)cand; /* the maxima reordered by the selection, in the candidates' room (2n floats) */
    memcpy(order, best, (size_t)blocks * sizeof *order);
    float bound = kth_highest(order, blocks, k);
    Py_ssize_t c = 0;
    for (Py_ssize_t b = 0; b <= blocks; b++) {
        Py_ssize_t start = b * len, end = b < blocks ? start + len : n;
        if (b < blocks && best[b] < bound) continue;
        for (Py_ssize_t i = start; i < end; i++)
            if (s[i] >= bound) cand[c++] = (Cand){s[i], (int32_t)i};
    }
    if (c < k) return -2;
    qsort(cand, (size_t)c, sizeof *cand, by_score);
    if (is_neg_inf(cand[0].v)) return -2; /* every score -inf */
    double total = 0.0, run = 0.0, kept = 0.0;
    float total32 = 0.0f, highest = cand[0].v;
    for (Py_ssize_t j = 0; j < k; j++) {
        cand[j].v = exp2_neg((cand[j].v - highest) * 1.44269504f); /* probabilities (unnormalized), in place */
        total += cand[j].v;
        total32 += cand[j].v;
    }
    for (Py_ssize_t j = 0; j < k; j++) { /* kept while the head before a token holds less than top_p */
        run += cand[j].v;
        if (top_p >= 1.0 || run / total - cand[j].v / total32 < top_p) kept += cand[j].v;
        else cand[j].v = 0.0f;
    }
    run = 0.0;
    for (Py_ssize_t j = 0; j < k; j++) {
        run += cand[j].v;
        if (run / kept > u) return cand[j].id;
    }
    return cand[k - 1].id;
}

typedef struct {
    const char *name, *format; /* format q: int64 ("l" where long has 8 bytes) */
    int ndim, writable;
} Spec;

static int get(PyObject *obj, Py_buffer *view, const Spec *spec) {
    int flags = PyBUF_FORMAT | PyBUF_C_CONTIGUOUS | (spec->writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    const char *f = view->format[0] == '<' || view->format[0] == '=' ? view->format + 1 : view->format;
    int same = strcmp(f, spec->format) == 0 || (spec->format[0] == 'q' && strcmp(f, "l") == 0 && view->itemsize == 8);
    if (view->ndim != spec->ndim || !same) {
        PyErr_Format(PyExc_ValueError, "%s: a C-contiguous %d-D array of format '%s' is needed", spec->name,
                     spec->ndim, spec->format);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* Buffers of `count` objects per their specs; on failure none is held and -1 is returned. */
static int get_all(PyObject **objs, Py_buffer *views, const Spec *specs, int count) {
    for (int i = 0; i < count; i++)
        if (get(objs[i], &views[i], &specs[i]) < 0) {
            while (i-- > 0) PyBuffer_Release(&views[i]);
            return -1;
        }
    return 0;
}

static void release_all(Py_buffer *views, int count) {
    for (int i = 0; i < count; i++) PyBuffer_Release(&views[i]);
}

static PyObject *draw(PyObject *self, PyObject *args) {
    static const Spec specs[] = {{"logits", "f", 2, 0}, {"uniforms", "f", 2, 0}, {"work", "f", 1, 1},
                                 {"cum", "d", 1, 1}, {"out", "q", 1, 1}};
    PyObject *objs[5];
    Py_buffer v[5];
    float scale;
    double top_p;
    if (!PyArg_ParseTuple(args, "OOfdOOO", &objs[0], &objs[1], &scale, &top_p, &objs[2], &objs[3], &objs[4])
        || get_all(objs, v, specs, 5) < 0)
        return NULL;
    Py_ssize_t batch = v[0].shape[0], n = v[0].shape[1], draws = v[1].shape[1];
    PyObject *result = NULL;
    if (v[1].shape[0] != batch || v[4].shape[0] != batch || v[2].shape[0] < n
        || v[3].shape[0] < (n + BLOCK - 1) / BLOCK || n < 1 || draws < 1)
        PyErr_SetString(PyExc_ValueError, "draw: shapes do not match (batch, vocab) logits");
    else {
        Py_BEGIN_ALLOW_THREADS
        draw_rows(v[0].buf, v[1].buf, batch, n, draws, scale, top_p, v[2].buf, v[3].buf, v[4].buf);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    release_all(v, 5);
    return result;
}

static PyObject *top_k(PyObject *self, PyObject *args) {
    static const Spec specs[] = {{"logits", "f", 2, 0}, {"uniforms", "f", 1, 0}, {"scaled", "f", 1, 1},
                                 {"maxima", "f", 1, 1}, {"candidates", "d", 1, 1}, {"out", "q", 1, 1}};
    PyObject *objs[6];
    Py_buffer v[6];
    float inverse;
    Py_ssize_t k;
    double top_p;
    if (!PyArg_ParseTuple(args, "OOfndOOOO", &objs[0], &objs[1], &inverse, &k, &top_p, &objs[2], &objs[3], &objs[4],
                          &objs[5])
        || get_all(objs, v, specs, 6) < 0)
        return NULL;
    Py_ssize_t batch = v[0].shape[0], n = v[0].shape[1];
    PyObject *result = NULL;
    if (v[1].shape[0] != batch || v[5].shape[0] != batch || v[2].shape[0] < n || v[3].shape[0] < n
        || v[4].shape[0] < n || k < 1 || k > n || n > INT32_MAX)
        PyErr_SetString(PyExc_ValueError, "top_k: shapes do not match (batch, vocab) logits and 1 <= k <= vocab");
    else {
        const float *x = v[0].buf, *u = v[1].buf;
        int64_t *out = v[5].buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t r = 0; r < batch; r++)
            out[r] = top_k_row(x + r * n, n, inverse, k, top_p, u[r], v[2].buf, v[3].buf, v[4].buf);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    release_all(v, 6);
    return result;
}

static PyMethodDef methods[] = {
    {"draw", draw, METH_VARARGS, "draw(logits, uniforms, scale, top_p, work, cum, out): see the module's source"},
    {"top_k", top_k, METH_VARARGS,
     "top_k(logits, u0, inverse, k, top_p, scaled, maxima, candidates, out): see the module's source"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nucleus", "runtime/sampling.py's compiled top-p draw",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__nucleus(void) { return PyModule_Create(&module); }
