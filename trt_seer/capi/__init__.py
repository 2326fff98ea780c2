"""The C ABI (trt_seer.h) for C, C++, Rust and Go services: libtrt_seer.so embeds the Python
runtime and calls `trt_seer.runtime.load` / `Model.infer` on caller-owned buffers.

    python -m trt_seer.capi.build --out build/capi --example
    build/capi/trt_seer_example engines/all-MiniLM-L6-v2.fp16.engine --batch 2 --seq 8

trt_seer.h is the interface, trt_seer.c the library, bridge.py its Python side, example.c a
complete client; build.py compiles them. docs/RUNTIME.md describes the contract and the costs.
"""
