/* Error paths of the C ABI, for tests/test_capi.py: one line per case, "case<TAB>status<TAB>message".
 * Usage: capi_errors ARTIFACT (an encoder with inputs input_ids, attention_mask[, token_type_ids]). */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "trt_seer.h"

static void report(const char *name, trt_seer_status st) {
    printf("%s\t%d\t%s\n", name, (int)st, trt_seer_last_error());
}

static int64_t ids[2 * 4] = {5, 6, 7, 8, 9, 10, 11, 12}, ones[2 * 4] = {1, 1, 1, 1, 1, 1, 1, 1};
static int64_t zeros[2 * 4];
static int64_t shape[2] = {2, 4}, other_batch[2] = {1, 4}, flat[1] = {8};
static trt_seer_input inputs[3];
static int32_t n_inputs;

static void good_inputs(trt_seer_model *m) {
    const void *data[] = {ids, ones, zeros};
    trt_seer_num_inputs(m, &n_inputs);
    for (int32_t i = 0; i < n_inputs; ++i) {
        trt_seer_tensor_info t;
        trt_seer_input_info(m, i, &t);
        const void *d = !strcmp(t.name, "input_ids") ? data[0] : !strcmp(t.name, "attention_mask") ? data[1] : data[2];
        inputs[i] = (trt_seer_input){t.name, TRT_SEER_INT64, 2, shape, d};
    }
}

/* Several threads run one model at once; each must get the single-threaded answer. */
static trt_seer_model *shared;
static float reference[2 * 32];

static void *worker(void *arg) {
    float mine[2 * 32];
    trt_seer_output o = {.name = "sentence_embedding", .data = mine, .capacity_bytes = sizeof mine};
    for (int i = 0; i < 20; ++i)
        if (trt_seer_run(shared, n_inputs, inputs, 1, &o) != TRT_SEER_OK || memcmp(mine, reference, sizeof mine))
            *(int *)arg = 1;
    return NULL;
}

static void threads_agree(trt_seer_model *m) {
    trt_seer_output o = {.name = "sentence_embedding", .data = reference, .capacity_bytes = sizeof reference};
    pthread_t t[4];
    int bad[4] = {0, 0, 0, 0}, any = trt_seer_run(m, n_inputs, inputs, 1, &o) != TRT_SEER_OK;
    shared = m;
    for (int i = 0; i < 4; ++i) pthread_create(&t[i], NULL, worker, &bad[i]);
    for (int i = 0; i < 4; ++i) pthread_join(t[i], NULL), any |= bad[i];
    printf("threads_agree\t%d\t%s\n", any, any ? "a thread's call failed or differed" : "");
}

static void *other_thread(void *arg) {
    (void)arg;
    printf("thread_sees\t0\t%s\n", trt_seer_last_error()); /* this thread failed nothing */
    return NULL;
}

/* A prepared call refuses what it was not prepared for, before copying anything in. */
static void prepared_errors(trt_seer_model *m) {
    float emb[2 * 32], tiny[1];
    trt_seer_output o = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
    trt_seer_prepared *p = NULL;
    good_inputs(m);
    inputs[0].dtype = TRT_SEER_INT32;
    report("prepare_dtype", trt_seer_prepare(m, n_inputs, inputs, 1, &o, &p));
    good_inputs(m);
    inputs[1].shape = other_batch;
    report("prepare_batch_mismatch", trt_seer_prepare(m, n_inputs, inputs, 1, &o, &p));
    good_inputs(m);
    report("prepare", trt_seer_prepare(m, n_inputs, inputs, 1, &o, &p));
    printf("prepare_shape\t%d\t%s [%lld, %lld]\n", o.ndim, trt_seer_dtype_name(o.dtype), (long long)o.shape[0],
           (long long)o.shape[1]);
    report("prepared_run", trt_seer_prepared_run(p, n_inputs, inputs, 1, &o));
    inputs[0].shape = other_batch;
    report("prepared_other_shape", trt_seer_prepared_run(p, n_inputs, inputs, 1, &o));
    good_inputs(m);
    inputs[0].dtype = TRT_SEER_INT32;
    report("prepared_other_dtype", trt_seer_prepared_run(p, n_inputs, inputs, 1, &o));
    good_inputs(m);
    trt_seer_input swapped[3] = {inputs[1], inputs[0], inputs[2]};
    report("prepared_other_order", trt_seer_prepared_run(p, n_inputs, swapped, 1, &o));
    trt_seer_output small = {.data = tiny, .capacity_bytes = sizeof tiny};
    report("prepared_small_buffer", trt_seer_prepared_run(p, n_inputs, inputs, 1, &small));
    report("prepared_missing_output", trt_seer_prepared_run(p, n_inputs, inputs, 0, &o));
    report("prepared_close", trt_seer_prepared_close(p));
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    trt_seer_model *m = NULL;
    float big[2 * 4 * 64], tiny[1];
    trt_seer_output out = {.name = "sentence_embedding", .data = big, .capacity_bytes = sizeof big};

    report("missing_file", trt_seer_open("/nonexistent/model.fp32.onnx", NULL, NULL, &m));
    report("bad_backend", trt_seer_open(argv[1], "cuda", NULL, &m));
    report("bad_options", trt_seer_open(argv[1], NULL, "{threads: 1", &m));
    report("unknown_option", trt_seer_open(argv[1], NULL, "{\"threadz\": 1}", &m));
    report("null_model", trt_seer_run(NULL, 0, NULL, 1, &out));
    pthread_t t;
    pthread_create(&t, NULL, other_thread, NULL);
    pthread_join(t, NULL);
    report("open", trt_seer_open(argv[1], "onnxruntime", "{\"threads\": 1}", &m));
    if (m == NULL) return 1;
    good_inputs(m);
    report("run", trt_seer_run(m, n_inputs, inputs, 1, &out));

    trt_seer_tensor_info info;
    report("info_range", trt_seer_input_info(m, 99, &info));

    inputs[0].name = "input_idz";
    report("wrong_name", trt_seer_run(m, n_inputs, inputs, 1, &out));
    good_inputs(m);
    inputs[0].ndim = 1, inputs[0].shape = flat;
    report("wrong_rank", trt_seer_run(m, n_inputs, inputs, 1, &out));
    good_inputs(m);
    inputs[1].shape = other_batch;
    report("batch_mismatch", trt_seer_output_shapes(m, n_inputs, inputs, 1, &out)); /* the query validates too */
    good_inputs(m);
    inputs[0].dtype = TRT_SEER_INT32;
    report("wrong_dtype", trt_seer_run(m, n_inputs, inputs, 1, &out));
    good_inputs(m);
    inputs[0].data = NULL;
    report("null_data", trt_seer_run(m, n_inputs, inputs, 1, &out));
    good_inputs(m);
    report("missing_input", trt_seer_run(m, n_inputs - 1, inputs, 1, &out));

    trt_seer_output small = {.name = "sentence_embedding", .data = tiny, .capacity_bytes = sizeof tiny};
    report("small_buffer", trt_seer_run(m, n_inputs, inputs, 1, &small));
    trt_seer_output unknown = {.name = "pooler_output", .data = big, .capacity_bytes = sizeof big};
    report("unknown_output", trt_seer_run(m, n_inputs, inputs, 1, &unknown));
    report("run_again", trt_seer_run(m, n_inputs, inputs, 1, &out));
    threads_agree(m);
    prepared_errors(m);
    report("close", trt_seer_close(m));
    return 0;
}
