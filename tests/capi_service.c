/* The C ABI in a long-running service, for tests/test_capi_service.py (run under AddressSanitizer):
 *
 *   capi_service ARTIFACT bad     bad data and small buffers: "case<TAB>status<TAB>message" rows, and
 *                                 "untouched<TAB>N" counting calls that changed a caller buffer
 *   capi_service ARTIFACT close   threads run (plain and prepared) while main closes the model and
 *                                 the prepared calls; late calls must get TRT_SEER_E_INPUT
 *   capi_service ARTIFACT exit    threads run while main returns (the library's exit handler waits)
 *   capi_service ARTIFACT shutdown  threads run while main calls trt_seer_shutdown, then returns
 *   capi_service ARTIFACT fork    a child forked after open is refused with TRT_SEER_E_RUNTIME
 *   capi_service ARTIFACT cache   threads run two shapes in turns (trt_seer_run's cache takes the
 *                                 repeats) with bad token ids among them; each output must equal the
 *                                 first, uncached run's bit for bit; then main closes the model
 *
 * ARTIFACT: an encoder taking input_ids, attention_mask[, token_type_ids] (int64) and returning
 * sentence_embedding [batch, 32] float32. Exit status 0 when every check held.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "trt_seer.h"

#define BATCH 2
#define SEQ 8
#define LONG_SEQ 200 /* the tiny model has 128 positions */
#define HIDDEN 32

static int64_t ids[BATCH * LONG_SEQ], ones[BATCH * LONG_SEQ], zeros[BATCH * LONG_SEQ];
static int64_t shape[2] = {BATCH, SEQ};
static trt_seer_input inputs[3];
static int32_t n_inputs;
static trt_seer_model *model;

static void report(const char *name, trt_seer_status st) { printf("%s\t%d\t%s\n", name, (int)st, trt_seer_last_error()); }

/* The model's inputs of shape `dims` into `in`, input_ids from `token_ids`. */
static void fill_inputs(trt_seer_input *in, trt_seer_model *m, const int64_t *dims, const int64_t *token_ids) {
    trt_seer_num_inputs(m, &n_inputs);
    for (int32_t i = 0; i < n_inputs; ++i) {
        trt_seer_tensor_info t;
        trt_seer_input_info(m, i, &t);
        const void *d = !strcmp(t.name, "input_ids") ? token_ids : !strcmp(t.name, "attention_mask") ? ones : zeros;
        in[i] = (trt_seer_input){t.name, TRT_SEER_INT64, 2, dims, d};
    }
}

static void make_inputs(trt_seer_model *m, const int64_t *dims) { fill_inputs(inputs, m, dims, ids); }

static void reset_data(void) {
    for (int i = 0; i < BATCH * LONG_SEQ; ++i) ids[i] = 5 + i % 50, ones[i] = 1, zeros[i] = 0;
}

/* ------------------------------------------------------------------ bad data, small buffers */

static int untouched(const unsigned char *buf, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (buf[i] != 0xAB) return 0;
    return 1;
}

static int bad(void) {
    float emb[BATCH * HIDDEN], hidden[BATCH * SEQ * HIDDEN], tiny[4];
    int changed = 0;
    trt_seer_output both[2] = {{.name = "last_hidden_state", .data = hidden, .capacity_bytes = sizeof hidden},
                               {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb}};
    trt_seer_tensor_info info;
    trt_seer_input_info(model, 0, &info);
    printf("input_info\t0\t%s max [%lld, %lld]\n", info.name, (long long)info.max_shape[0], (long long)info.max_shape[1]);
#define CASE(name, call)                                        \
    do {                                                        \
        memset(emb, 0xAB, sizeof emb);                          \
        memset(hidden, 0xAB, sizeof hidden);                    \
        report(name, call);                                     \
        changed += !untouched((unsigned char *)emb, sizeof emb) || !untouched((unsigned char *)hidden, sizeof hidden); \
        reset_data();                                           \
        make_inputs(model, shape);                              \
    } while (0)
    reset_data();
    make_inputs(model, shape);
    ids[3] = 50000;
    CASE("id_too_large", trt_seer_run(model, n_inputs, inputs, 2, both));
    ids[9] = -1;
    CASE("id_negative", trt_seer_run(model, n_inputs, inputs, 2, both));
    int64_t long_shape[2] = {BATCH, LONG_SEQ};
    make_inputs(model, long_shape);
    CASE("too_long", trt_seer_run(model, n_inputs, inputs, 2, both));
    both[1].capacity_bytes = sizeof tiny; /* the second is short: the first must not be written either */
    CASE("small_second_buffer", trt_seer_run(model, n_inputs, inputs, 2, both));
    both[1].capacity_bytes = sizeof emb;

    trt_seer_prepared *p = NULL;
    report("prepare", trt_seer_prepare(model, n_inputs, inputs, 2, both, &p));
    ids[15] = 128;
    CASE("prepared_id_too_large", trt_seer_prepared_run(p, n_inputs, inputs, 2, both));
    ids[0] = -7;
    CASE("prepared_id_negative", trt_seer_prepared_run(p, n_inputs, inputs, 2, both));
    both[1].capacity_bytes = sizeof tiny;
    CASE("prepared_small_second_buffer", trt_seer_prepared_run(p, n_inputs, inputs, 2, both));
    both[1].capacity_bytes = sizeof emb;
    report("prepared_run", trt_seer_prepared_run(p, n_inputs, inputs, 2, both));
    report("prepared_close", trt_seer_prepared_close(p));
    report("run", trt_seer_run(model, n_inputs, inputs, 2, both));

    trt_seer_model *other = NULL;
    report("threads_string", trt_seer_open(getenv("ARTIFACT"), NULL, "{\"threads\": \"2\"}", &other));
    inputs[0].shape = NULL;
    report("null_shape", trt_seer_run(model, n_inputs, inputs, 2, both));
    printf("untouched\t%d\t\n", changed);
    report("close", trt_seer_close(model));
    return changed != 0;
}

/* ------------------------------------------------------------------ races */

typedef struct {
    int ok, closed, other; /* counts of statuses */
    int prepared;
    volatile int *stop;
} worker_t;

static void *worker(void *arg) {
    worker_t *w = arg;
    float emb[BATCH * HIDDEN];
    trt_seer_output out = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
    trt_seer_prepared *p = NULL;
    if (w->prepared && trt_seer_prepare(model, n_inputs, inputs, 1, &out, &p) != TRT_SEER_OK) w->other++;
    while (!*w->stop) {
        trt_seer_status st = w->prepared ? trt_seer_prepared_run(p, n_inputs, inputs, 1, &out)
                                         : trt_seer_run(model, n_inputs, inputs, 1, &out);
        if (st == TRT_SEER_OK) w->ok++;
        else if (st == TRT_SEER_E_INPUT && (strstr(trt_seer_last_error(), "closed") ||
                                            strstr(trt_seer_last_error(), "trt_seer_shutdown was called")))
            w->closed++;
        else {
            fprintf(stderr, "worker: status %d: %s\n", (int)st, trt_seer_last_error());
            w->other++;
        }
        if (w->closed > 50) break; /* the refusal is stable */
    }
    if (p && trt_seer_prepared_close(p) != TRT_SEER_OK) w->other++;
    return NULL;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

#define WORKERS 4

static void start_workers(pthread_t *t, worker_t *w, volatile int *stop) {
    for (int i = 0; i < WORKERS; ++i) {
        w[i] = (worker_t){0, 0, 0, i % 2, stop};
        pthread_create(&t[i], NULL, worker, &w[i]);
    }
}

static int close_race(void) {
    pthread_t t[WORKERS];
    worker_t w[WORKERS];
    volatile int stop = 0;
    reset_data();
    make_inputs(model, shape);
    start_workers(t, w, &stop);
    sleep_ms(300);
    report("close", trt_seer_close(model)); /* while the workers run */
    sleep_ms(50);
    stop = 1;
    int ok = 0, closed = 0, other = 0;
    for (int i = 0; i < WORKERS; ++i) pthread_join(t[i], NULL), ok += w[i].ok, closed += w[i].closed, other += w[i].other;
    int32_t n = 0;
    report("late_num_inputs", trt_seer_num_inputs(model, &n));
    float emb[BATCH * HIDDEN];
    trt_seer_output out = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
    report("late_run", trt_seer_run(model, n_inputs, inputs, 1, &out));
    report("close_again", trt_seer_close(model));
    printf("calls\t%d\tok %d closed %d other %d\n", other, ok, closed, other);
    return other != 0 || ok == 0 || closed == 0;
}

static int exit_race(int shutdown_first) {
    static pthread_t t[WORKERS];
    static worker_t w[WORKERS];
    static volatile int stop = 0; /* never set: main returns with the workers running */
    reset_data();
    make_inputs(model, shape);
    start_workers(t, w, &stop);
    sleep_ms(300);
    if (shutdown_first) {
        report("shutdown", trt_seer_shutdown());
        float emb[BATCH * HIDDEN];
        trt_seer_output out = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
        report("after_shutdown", trt_seer_run(model, n_inputs, inputs, 1, &out));
    }
    printf("returning\t0\t\n");
    fflush(stdout);
    return 0;
}

static int fork_child(void) {
    float emb[BATCH * HIDDEN];
    trt_seer_output out = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
    reset_data();
    make_inputs(model, shape);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        trt_seer_model *m = NULL;
        report("child_run", trt_seer_run(model, n_inputs, inputs, 1, &out));
        report("child_open", trt_seer_open(getenv("ARTIFACT"), NULL, NULL, &m));
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    report("parent_run", trt_seer_run(model, n_inputs, inputs, 1, &out));
    report("close", trt_seer_close(model));
    return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* ------------------------------------------------------------------ the run cache under threads */

#define CACHE_RUNS 120
static const int64_t shape_a[2] = {BATCH, SEQ}, shape_b[2] = {BATCH, SEQ - 3};
static float want_a[BATCH * HIDDEN], want_b[BATCH * HIDDEN]; /* from each shape's first (plain) run */

typedef struct {
    int id;
    int wrong, refused, failed; /* outputs unlike the first run's; bad ids refused as they must be; others */
} cache_worker_t;

/* One run of `dims` into a 0xAB-filled buffer; 1 when it went as it must: equal to `want`, or, with a
 * bad id, refused with TRT_SEER_E_INPUT naming it and the buffer untouched. */
static int cache_run(cache_worker_t *w, const int64_t *dims, int64_t *token_ids, const float *want, int bad) {
    trt_seer_input in[3];
    float emb[BATCH * HIDDEN];
    trt_seer_output out = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
    fill_inputs(in, model, dims, token_ids);
    memset(emb, 0xAB, sizeof emb);
    int64_t good_id = token_ids[3];
    if (bad) token_ids[3] = 50000;
    trt_seer_status st = trt_seer_run(model, n_inputs, in, 1, &out);
    token_ids[3] = good_id;
    if (bad) {
        int ok = st == TRT_SEER_E_INPUT && strstr(trt_seer_last_error(), "holds 50000 at [0, 3]") &&
                 untouched((unsigned char *)emb, sizeof emb);
        w->refused += ok;
        return ok;
    }
    if (st != TRT_SEER_OK) return 0;
    w->wrong += memcmp(emb, want, sizeof emb) != 0;
    return 1;
}

static void *cache_worker(void *arg) {
    cache_worker_t *w = arg;
    int64_t own_ids[BATCH * SEQ]; /* this thread's token ids: the bad ones must not reach the others */
    for (int i = 0; i < BATCH * SEQ; ++i) own_ids[i] = 5 + i % 50;
    for (int r = 0; r < CACHE_RUNS; ++r) {
        int b = (r / 10 + w->id) % 3 == 0; /* runs of ten of one shape; the threads out of step */
        if (!cache_run(w, b ? shape_b : shape_a, own_ids, b ? want_b : want_a, r % 13 == 12)) w->failed++;
    }
    return NULL;
}

static int cache_threads(void) {
    float emb[BATCH * HIDDEN];
    trt_seer_output out = {.name = "sentence_embedding", .data = emb, .capacity_bytes = sizeof emb};
    reset_data();
    make_inputs(model, shape_b); /* B first, so that the threads find A's call made by main */
    report("first_b", trt_seer_run(model, n_inputs, inputs, 1, &out));
    memcpy(want_b, emb, sizeof emb);
    make_inputs(model, shape_a);
    report("first_a", trt_seer_run(model, n_inputs, inputs, 1, &out));
    memcpy(want_a, emb, sizeof emb);
    for (int r = 0; r < 3; ++r) trt_seer_run(model, n_inputs, inputs, 1, &out); /* A's call is made */
    pthread_t t[WORKERS];
    cache_worker_t w[WORKERS];
    for (int i = 0; i < WORKERS; ++i) {
        w[i] = (cache_worker_t){.id = i};
        pthread_create(&t[i], NULL, cache_worker, &w[i]);
    }
    int wrong = 0, refused = 0, failed = 0;
    for (int i = 0; i < WORKERS; ++i) pthread_join(t[i], NULL), wrong += w[i].wrong, refused += w[i].refused, failed += w[i].failed;
    printf("threads\t0\twrong %d refused %d failed %d\n", wrong, refused, failed);
    report("close", trt_seer_close(model)); /* with a cached call */
    report("late_run", trt_seer_run(model, n_inputs, inputs, 1, &out));
    return wrong != 0 || failed != 0 || refused != WORKERS * (CACHE_RUNS / 13);
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    setenv("ARTIFACT", argv[1], 1);
    setvbuf(stdout, NULL, _IOLBF, 0);
    trt_seer_status st = trt_seer_open(argv[1], "onnxruntime", "{\"threads\": 1}", &model);
    if (st != TRT_SEER_OK) {
        fprintf(stderr, "open: %d %s\n", (int)st, trt_seer_last_error());
        return 3;
    }
    if (!strcmp(argv[2], "bad")) return bad();
    if (!strcmp(argv[2], "close")) return close_race();
    if (!strcmp(argv[2], "exit")) return exit_race(0);
    if (!strcmp(argv[2], "shutdown")) return exit_race(1);
    if (!strcmp(argv[2], "fork")) return fork_child();
    if (!strcmp(argv[2], "cache")) return cache_threads();
    return 2;
}
