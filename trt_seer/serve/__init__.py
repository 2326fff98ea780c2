"""Serving: a Triton Inference Server model repository from an engine or ONNX artifact.

    trt-seer triton engines/all-MiniLM-L6-v2.fp16.engine --repo models/
    tritonserver --model-repository models/

`triton.triton_repo_from_artifact` reads the artifact's manifest, `config` turns it into a Triton
model configuration, `schema` checks the text against Triton's own `ModelConfig` protobuf.
"""
