"""trt_seer: build verified FP16/INT8 TensorRT engines from fine-tuned Hugging Face checkpoints.

Run `python -m trt_seer build --fp16` to export the default model, convert it and build an engine.
This module imports nothing heavy: torch, transformers, onnx and TensorRT load where they are used.
"""

__version__ = "0.1.0"
