"""`trt-seer bench`: latency, throughput, memory, size, cost and accuracy of every inference path
this machine can run, in one table.

    python -m trt_seer bench --engines engines/ --batch 1,8,32 --seq 128 --report out/
    python -m trt_seer bench --model-config bert-base      # random-init BERT-base, speed only

Paths: PyTorch (FP32 eager with TF32 off / on, AMP FP16 / BF16 and `.half()` on a GPU, dynamic
INT8 on the CPU), ONNX Runtime on `<engines>/<name>.{fp32,fp16,int8}.onnx`, and the TensorRT
engines `<engines>/<name>.{fp32,fp16,int8}.engine` (FP16 also with CUDA graphs). A path this
machine cannot run is listed as skipped with the reason, never left out.

Method: every path runs in a fresh Python process, so its peak RSS (VmHWM), the CUDA
allocator's peak and its thread pools are its own. Per batch size: warm-up, then timed runs until
the median moves less than `rtol` between two checks (or the time budget is spent); p50/p90/p99
and the coefficient of variation, flagged noisy above 10%. Every call is timed end to end, host
(numpy) inputs to host outputs; GPU paths also report the device time of the model's own work
(CUDA events). Throughput and cost come from the end-to-end median. Inputs are held-out text
tokenised and padded / truncated to exactly batch x seq.

Modules, in the order a run uses them:
    paths     the path table, row labels, artifacts, skip reasons
    host      what this machine offers (probe_host, cpu_name)
    model     the checkpoint or a random-initialised one (RANDOM_CONFIGS)
    plan      BenchSpec and, per path, the batches it runs or why it is skipped
    run       one worker process per path, then the report dict and the manifests' `bench` sections
    worker    the per-path process; runners: one runner per backend
    measure   TimingSpec, the stop rule, percentiles, throughput and cost
    verdict   whether INT8 pays against its base (also read by `build --int8`)
    report    table, report.md/.json, plots, and the one writer of docs/BENCHMARKS.md
This file imports nothing, so `import trt_seer.bench.<module>` loads only what it names.
"""
