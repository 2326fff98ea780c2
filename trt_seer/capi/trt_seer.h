/* trt_seer.h: the C ABI of the trt_seer runtime, for C, C++, Rust (bindgen / extern "C") and
 * Go (cgo) services.
 *
 *   trt_seer_model *m;
 *   if (trt_seer_open("engines/x.fp16.engine", NULL, NULL, &m) != TRT_SEER_OK)
 *       fprintf(stderr, "%s\n", trt_seer_last_error());
 *   ... trt_seer_output_shapes(m, n_in, inputs, n_out, outputs);   // sizes for the buffers
 *   ... trt_seer_run(m, n_in, inputs, n_out, outputs);
 *   ... or, for a loop of fixed shapes: trt_seer_prepare(m, ..., &p); trt_seer_prepared_run(p, ...);
 *   trt_seer_close(m);
 *
 * Build: `python -m trt_seer.capi.build --out DIR` writes libtrt_seer.so and this header to DIR
 * and prints the compiler and linker flags. docs/RUNTIME.md describes the design and its costs.
 *
 * Every function returns a trt_seer_status; on failure trt_seer_last_error() returns a one-line
 * message for the calling thread, and nothing is written to stderr. Memory is host memory,
 * contiguous and row-major (C order). Any thread may call any function; calls on one model may
 * overlap. Inputs are validated (names, dtypes, shapes, the profile and the model's positions,
 * token ids within the model's tables) and output buffers sized before any work: a failure leaves
 * every caller buffer untouched. A closed model or prepared call stays a valid argument: calls on
 * it return TRT_SEER_E_INPUT. Before returning from main with calls in flight, call
 * trt_seer_shutdown(). fork() after the first trt_seer_open is refused in the child
 * (TRT_SEER_E_RUNTIME): fork before it, or exec.
 */
#ifndef TRT_SEER_H
#define TRT_SEER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TRT_SEER_ABI_VERSION 1
#define TRT_SEER_MAX_DIMS 8

typedef enum {
    TRT_SEER_OK = 0,
    TRT_SEER_E_INPUT = 1,      /* bad argument, missing file, wrong input name/dtype/shape */
    TRT_SEER_E_MANIFEST = 2,   /* the engine's manifest does not match this runtime or GPU */
    TRT_SEER_E_DEPENDENCY = 3, /* no usable TensorRT / GPU / ONNX Runtime for this artifact */
    TRT_SEER_E_BUFFER = 4,     /* an output buffer is smaller than the output */
    TRT_SEER_E_CUDA = 5,       /* a CUDA call failed */
    TRT_SEER_E_RUNTIME = 6,    /* any other runtime failure (the message says which) */
    TRT_SEER_E_INTERNAL = 7    /* the embedded runtime could not start or raised unexpectedly */
} trt_seer_status;

/* The order is part of the ABI. */
typedef enum {
    TRT_SEER_FLOAT32 = 0,
    TRT_SEER_FLOAT16 = 1,
    TRT_SEER_BFLOAT16 = 2,
    TRT_SEER_FLOAT64 = 3,
    TRT_SEER_INT64 = 4,
    TRT_SEER_INT32 = 5,
    TRT_SEER_INT8 = 6,
    TRT_SEER_UINT8 = 7,
    TRT_SEER_BOOL = 8
} trt_seer_dtype;

typedef struct trt_seer_model trt_seer_model; /* opaque */

/* One input or output as the artifact's manifest / record describes it. */
typedef struct {
    const char *name;                      /* owned by the library; valid for the process's life */
    trt_seer_dtype dtype;
    int32_t ndim;
    int64_t shape[TRT_SEER_MAX_DIMS];      /* -1 for a dynamic axis */
    int64_t min_shape[TRT_SEER_MAX_DIMS];  /* the profile's bounds; -1 where the artifact has none */
    int64_t max_shape[TRT_SEER_MAX_DIMS];
} trt_seer_tensor_info;

/* An input the caller owns: read only, never retained after the call returns. */
typedef struct {
    const char *name;
    trt_seer_dtype dtype;
    int32_t ndim;
    const int64_t *shape;
    const void *data;                      /* may be NULL for trt_seer_output_shapes */
} trt_seer_input;

/* An output buffer the caller owns. `name` NULL means the model's output at the same index as
 * this entry. trt_seer_output_shapes and trt_seer_run set ndim, shape and dtype. */
typedef struct {
    const char *name;
    void *data;                            /* ignored by trt_seer_output_shapes */
    size_t capacity_bytes;
    trt_seer_dtype dtype;                  /* out */
    int32_t ndim;                          /* out */
    int64_t shape[TRT_SEER_MAX_DIMS];      /* out */
} trt_seer_output;

/* Opens an engine or ONNX artifact with the rules of Python's trt_seer.runtime.load: `backend`
 * is "auto" (NULL), "tensorrt" or "onnxruntime"; "auto" runs an engine's sibling .onnx on ONNX
 * Runtime where TensorRT cannot run it (and warns on stderr). `options_json` (NULL or a JSON
 * object) holds load()'s options, e.g. {"threads": 1} or {"contexts": 2, "device": 0}. */
trt_seer_status trt_seer_open(const char *path, const char *backend, const char *options_json,
                              trt_seer_model **model);

/* "tensorrt" or "onnxruntime": the backend the model runs on; valid for the process's life. */
trt_seer_status trt_seer_backend(const trt_seer_model *model, const char **backend);

trt_seer_status trt_seer_num_inputs(const trt_seer_model *model, int32_t *count);
trt_seer_status trt_seer_num_outputs(const trt_seer_model *model, int32_t *count);
trt_seer_status trt_seer_input_info(const trt_seer_model *model, int32_t index, trt_seer_tensor_info *info);
trt_seer_status trt_seer_output_info(const trt_seer_model *model, int32_t index, trt_seer_tensor_info *info);

/* Validates the inputs' names, dtypes and shapes (data may be NULL) and sets each output's shape
 * and dtype for them, so the caller can size the buffers: trt_seer_output_nbytes(&outputs[i]). */
trt_seer_status trt_seer_output_shapes(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                                       int32_t n_outputs, trt_seer_output *outputs);

/* Runs one batch: every model input once; any subset of the outputs (the others are dropped).
 * Copies each output into its buffer and sets its shape; TRT_SEER_E_BUFFER when one is too small.
 * After two consecutive runs of the same input names, dtypes and shapes and outputs, the model keeps
 * a prepared call for them that later such runs use (the same checks and results, less overhead); on
 * TensorRT it holds one more execution context until trt_seer_close, and making it adds tens of
 * milliseconds to the run that makes it and the first runs through it (docs/RUNTIME.md, "Run cache";
 * trt_seer_run_cache_stats below). */
trt_seer_status trt_seer_run(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                             int32_t n_outputs, trt_seer_output *outputs);

/* trt_seer_run's run cache for this model since it was opened (docs/RUNTIME.md, "Run cache"): runs it
 * served through its cached prepared call, cached calls made, and calls made or tried (a try gives none
 * where an output's shape only follows from the run, or TensorRT has no memory for one more context).
 * Any pointer may be NULL; also valid after trt_seer_close. For monitoring and benchmarks. */
trt_seer_status trt_seer_run_cache_stats(trt_seer_model *model, uint64_t *served, uint64_t *made, uint64_t *tried);

/* Releases the model (NULL is fine): refuses new calls on it at once (TRT_SEER_E_INPUT "the model
 * is closed"), waits for the calls in flight, then frees what it holds. Closing again is fine. */
trt_seer_status trt_seer_close(trt_seer_model *model);

/* A prepared call, for a loop that runs the same input shapes many times: the checks are done once
 * and, on TensorRT, the call has an execution context of its own. */
typedef struct trt_seer_prepared trt_seer_prepared; /* opaque */

/* Prepares calls of fixed input shapes: `inputs` give every model input's name, dtype and shape
 * (data is ignored), `outputs` the outputs to return (by name, or the model's output at the same
 * index where name is NULL). Checks them as trt_seer_run would and sets each output entry's dtype
 * and shape. Release with trt_seer_prepared_close (before or after trt_seer_close of its model). */
trt_seer_status trt_seer_prepare(trt_seer_model *model, int32_t n_inputs, const trt_seer_input *inputs,
                                 int32_t n_outputs, trt_seer_output *outputs, trt_seer_prepared **prepared);

/* Runs a prepared call: `inputs` in the order, with the names, dtypes and shapes it was prepared
 * with; `outputs` in the prepared order (names may be NULL), each buffer at least as large as its
 * output (TRT_SEER_E_BUFFER otherwise). One thread at a time per prepared call (another thread's
 * run fails with TRT_SEER_E_INPUT); prepare one per thread. */
trt_seer_status trt_seer_prepared_run(trt_seer_prepared *prepared, int32_t n_inputs, const trt_seer_input *inputs,
                                      int32_t n_outputs, trt_seer_output *outputs);

/* Releases a prepared call (NULL is fine); waits for a run in flight; later runs get TRT_SEER_E_INPUT. */
trt_seer_status trt_seer_prepared_close(trt_seer_prepared *prepared);

/* For a service's exit: refuses every later call (TRT_SEER_E_INPUT), waits for the calls in flight
 * in other threads, then releases every model and prepared call still open. Also runs at exit()
 * when the library started its own Python, so returning from main with calls in flight is safe. */
trt_seer_status trt_seer_shutdown(void);

/* The calling thread's message of its last failed call; "" after a successful one. */
const char *trt_seer_last_error(void);

const char *trt_seer_dtype_name(trt_seer_dtype dtype); /* "float32", ...; "unknown" */
size_t trt_seer_dtype_size(trt_seer_dtype dtype);      /* bytes per element; 0 when unknown */
size_t trt_seer_output_nbytes(const trt_seer_output *output); /* from its dtype and shape */

#ifdef __cplusplus
}
#endif
#endif /* TRT_SEER_H */
