/* trt_seer_example: opens an artifact through the C ABI, prints its inputs and outputs, runs one
 * batch of token ids and prints the first values of every output.
 *
 *   python -m trt_seer.capi.build --out build/capi --example
 *   build/capi/trt_seer_example engines/x.fp16.engine [--batch 2] [--seq 8] [--backend auto]
 *                               [--options '{"threads": 1}'] [--dump DIR] [--repeat N] [--output NAME]
 *
 * Inputs: dim 0 is the batch, dim 1 the sequence; token ids (b * 31 + s * 7) % 97 + 3, an
 * attention mask that pads the last token of odd rows, zeros for every other input.
 * The batch then runs again as a prepared call (trt_seer_prepare), which must give the same bytes.
 * --dump writes each output's raw bytes to DIR/<name>.bin; --repeat times N more calls each way
 * (after 3 untimed trt_seer_run calls that make its run cache; prints what the first open cost and how
 * many timed trt_seer_run calls the cache took); --output asks for that output only.
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "trt_seer.h"

#define CHECK(call)                                                             \
    do {                                                                        \
        trt_seer_status st_ = (call);                                           \
        if (st_ != TRT_SEER_OK) {                                               \
            fprintf(stderr, "error %d: %s\n", (int)st_, trt_seer_last_error()); \
            return (int)st_;                                                    \
        }                                                                       \
    } while (0)

typedef struct {
    const char *path, *backend, *options, *dump, *output;
    int64_t batch, seq;
    int repeat;
} args_t;

static int parse_args(int argc, char **argv, args_t *a) {
    *a = (args_t){NULL, NULL, NULL, NULL, NULL, 2, 8, 0};
    for (int i = 1; i < argc; ++i) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--batch") && v) a->batch = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--seq") && v) a->seq = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--backend") && v) a->backend = argv[++i];
        else if (!strcmp(argv[i], "--options") && v) a->options = argv[++i];
        else if (!strcmp(argv[i], "--dump") && v) a->dump = argv[++i];
        else if (!strcmp(argv[i], "--repeat") && v) a->repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--output") && v) a->output = argv[++i];
        else if (argv[i][0] != '-' && !a->path) a->path = argv[i];
        else return 0;
    }
    return a->path != NULL && a->batch > 0 && a->seq > 0;
}

static void print_info(const char *kind, const trt_seer_tensor_info *t) {
    printf("%s %s %s [", kind, t->name, trt_seer_dtype_name(t->dtype));
    for (int32_t d = 0; d < t->ndim; ++d) printf(d ? ", %lld" : "%lld", (long long)t->shape[d]);
    printf("]\n");
}

/* An input's shape (-1 axes: 0 batch, 1 seq) and its values; NULL data when it cannot be made. */
static int make_input(const trt_seer_tensor_info *t, const args_t *a, trt_seer_input *in, int64_t *shape) {
    size_t n = 1;
    for (int32_t d = 0; d < t->ndim; ++d) {
        shape[d] = t->shape[d] >= 0 ? t->shape[d] : d == 0 ? a->batch : d == 1 ? a->seq : -1;
        if (shape[d] < 0) return fprintf(stderr, "input %s: dynamic axis %d is not batch or seq\n", t->name, d), 0;
        n *= (size_t)shape[d];
    }
    if (t->dtype != TRT_SEER_INT64 && t->dtype != TRT_SEER_INT32)
        return fprintf(stderr, "input %s: this example feeds token ids only\n", t->name), 0;
    int is_mask = strcmp(t->name, "attention_mask") == 0, is_ids = strcmp(t->name, "input_ids") == 0;
    int64_t seq = t->ndim > 1 ? shape[1] : 1;
    void *data = malloc(n * trt_seer_dtype_size(t->dtype));
    for (size_t i = 0; data && i < n; ++i) {
        int64_t b = (int64_t)i / seq, s = (int64_t)i % seq;
        int64_t v = is_ids ? (b * 31 + s * 7) % 97 + 3 : is_mask ? !(b % 2 == 1 && s == seq - 1) : 0;
        if (t->dtype == TRT_SEER_INT64) ((int64_t *)data)[i] = v;
        else ((int32_t *)data)[i] = (int32_t)v;
    }
    *in = (trt_seer_input){t->name, t->dtype, t->ndim, shape, data};
    return data != NULL;
}

static void print_output(const trt_seer_output *o) {
    printf("%s %s [", o->name, trt_seer_dtype_name(o->dtype));
    for (int32_t d = 0; d < o->ndim; ++d) printf(d ? ", %lld" : "%lld", (long long)o->shape[d]);
    printf("]:");
    size_t n = trt_seer_output_nbytes(o) / trt_seer_dtype_size(o->dtype);
    for (size_t i = 0; i < n && i < 6; ++i) {
        if (o->dtype == TRT_SEER_FLOAT32) printf(" %.9g", ((const float *)o->data)[i]);
        else if (o->dtype == TRT_SEER_INT64) printf(" %lld", (long long)((const int64_t *)o->data)[i]);
        else { printf(" (%s)", trt_seer_dtype_name(o->dtype)); break; }
    }
    printf("\n");
}

static int dump(const char *dir, const trt_seer_output *o) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.bin", dir, o->name);
    FILE *f = fopen(path, "wb");
    size_t n = trt_seer_output_nbytes(o);
    int good = f && fwrite(o->data, 1, n, f) == n;
    if (f) good = (fclose(f) == 0) && good;
    if (!good) fprintf(stderr, "cannot write %s\n", path);
    return good;
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double rss_mb(void) { /* resident memory, from Linux's /proc; 0 elsewhere */
    char line[256];
    double kb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb / 1024;
}

int main(int argc, char **argv) {
    args_t a;
    if (!parse_args(argc, argv, &a)) {
        fprintf(stderr, "usage: %s ARTIFACT [--batch N] [--seq N] [--backend auto|tensorrt|onnxruntime] "
                        "[--options JSON] [--dump DIR] [--repeat N] [--output NAME]\n", argv[0]);
        return 2;
    }
    trt_seer_model *m;
    const char *backend;
    int32_t n_in, n_out;
    double rss0 = rss_mb(), t_open = seconds();
    CHECK(trt_seer_open(a.path, a.backend, a.options, &m));
    t_open = seconds() - t_open;
    CHECK(trt_seer_backend(m, &backend));
    CHECK(trt_seer_num_inputs(m, &n_in));
    CHECK(trt_seer_num_outputs(m, &n_out));
    printf("backend %s\n", backend);

    trt_seer_input inputs[16];
    int64_t shapes[16][TRT_SEER_MAX_DIMS];
    trt_seer_output outputs[16];
    if (n_in > 16 || n_out > 16) return fprintf(stderr, "more than 16 inputs or outputs\n"), 1;
    for (int32_t i = 0; i < n_in; ++i) {
        trt_seer_tensor_info t;
        CHECK(trt_seer_input_info(m, i, &t));
        print_info("input", &t);
        if (!make_input(&t, &a, &inputs[i], shapes[i])) return 1;
    }
    for (int32_t i = 0; i < n_out; ++i) {
        trt_seer_tensor_info t;
        CHECK(trt_seer_output_info(m, i, &t));
        print_info("output", &t);
        outputs[i] = (trt_seer_output){.name = t.name};
    }
    if (a.output) { /* only this one is computed and copied */
        int32_t k = 0;
        while (k < n_out && strcmp(outputs[k].name, a.output) != 0) ++k;
        if (k == n_out) return fprintf(stderr, "the model has no output %s\n", a.output), 2;
        outputs[0] = outputs[k];
        n_out = 1;
    }
    /* two calls: the output shapes for these inputs, then the run into buffers of that size */
    CHECK(trt_seer_output_shapes(m, n_in, inputs, n_out, outputs));
    for (int32_t i = 0; i < n_out; ++i) {
        outputs[i].capacity_bytes = trt_seer_output_nbytes(&outputs[i]);
        outputs[i].data = malloc(outputs[i].capacity_bytes ? outputs[i].capacity_bytes : 1);
        if (!outputs[i].data) return fprintf(stderr, "out of memory\n"), 1;
    }
    CHECK(trt_seer_run(m, n_in, inputs, n_out, outputs));
    for (int32_t i = 0; i < n_out; ++i) {
        print_output(&outputs[i]);
        if (a.dump && !dump(a.dump, &outputs[i])) return 1;
    }
    /* the same batch as a prepared call: shapes checked once, then runs into buffers of its own */
    trt_seer_prepared *p;
    trt_seer_output again[16];
    CHECK(trt_seer_prepare(m, n_in, inputs, n_out, outputs, &p));
    for (int32_t i = 0; i < n_out; ++i) {
        again[i] = (trt_seer_output){.name = outputs[i].name, .capacity_bytes = outputs[i].capacity_bytes};
        if (!(again[i].data = malloc(again[i].capacity_bytes ? again[i].capacity_bytes : 1)))
            return fprintf(stderr, "out of memory\n"), 1;
    }
    for (int r = 0; r < 2; ++r) CHECK(trt_seer_prepared_run(p, n_in, inputs, n_out, again));
    for (int32_t i = 0; i < n_out; ++i)
        if (trt_seer_output_nbytes(&again[i]) != trt_seer_output_nbytes(&outputs[i]) ||
            memcmp(again[i].data, outputs[i].data, trt_seer_output_nbytes(&outputs[i])) != 0)
            return fprintf(stderr, "prepared call: %s differs from trt_seer_run's\n", outputs[i].name), 1;
    printf("prepared call: the same outputs\n");
    if (a.repeat > 0) {
        printf("first open: %.0f ms, resident memory +%.0f MB\n", 1e3 * t_open, rss_mb() - rss0);
        /* warm-up, as the prepared call's: the second run of this key makes trt_seer_run's cached
         * call (on TensorRT a context of its own: tens of ms) and the next two run through it */
        double t0 = seconds();
        for (int r = 0; r < 3; ++r) CHECK(trt_seer_run(m, n_in, inputs, n_out, outputs));
        double warm = seconds() - t0;
        uint64_t served0, served, made, tried;
        CHECK(trt_seer_run_cache_stats(m, &served0, NULL, NULL));
        t0 = seconds();
        for (int r = 0; r < a.repeat; ++r) CHECK(trt_seer_run(m, n_in, inputs, n_out, outputs));
        printf("per call: %.1f us (mean of %d)\n", 1e6 * (seconds() - t0) / a.repeat, a.repeat);
        CHECK(trt_seer_run_cache_stats(m, &served, &made, &tried));
        printf("run cache: %llu of %d calls through the cached call; calls made %llu, tried %llu; "
               "warm-up %.1f ms\n", (unsigned long long)(served - served0), a.repeat, (unsigned long long)made,
               (unsigned long long)tried, 1e3 * warm);
        t0 = seconds();
        for (int r = 0; r < a.repeat; ++r) CHECK(trt_seer_prepared_run(p, n_in, inputs, n_out, again));
        printf("per prepared call: %.1f us (mean of %d)\n", 1e6 * (seconds() - t0) / a.repeat, a.repeat);
    }
    CHECK(trt_seer_prepared_close(p));
    for (int32_t i = 0; i < n_in; ++i) free((void *)inputs[i].data);
    for (int32_t i = 0; i < n_out; ++i) free(outputs[i].data), free(again[i].data);
    CHECK(trt_seer_close(m));
    return 0;
}
