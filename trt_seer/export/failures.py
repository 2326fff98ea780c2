"""One line for a failed export: what failed, in which module of the model's code, at which operator."""
from __future__ import annotations

import re

from trt_seer.export.families import ModelInfo

# an operator as torch.export / the ONNX translator name it (aten.cummax, aten::eigh), or an ONNX
# node as ONNX Runtime names it (MatMul node. Name:'node_MatMul_50')
_OP = re.compile(r"(?:aten|prims|torch\.ops\.\w+)(?:\.|::)\w+(?:\.\w+)?|\w+ node\. Name:'[^']+'")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def failure_line(info: ModelInfo, stage: str, error: BaseException, module: str = "") -> str:
    """One line for a failed export stage: the innermost cause's first line, the model's code
    `module` when given, and the operator when an error of the chain names one (torch.export and
    the ONNX translator wrap the real cause)."""
    chain = [error]
    while chain[-1].__cause__ is not None and len(chain) < 8:
        chain.append(chain[-1].__cause__)
    texts = [_ANSI.sub("", str(e)).strip() for e in chain]
    ops = [m.group(0) for t in reversed(texts) for m in [_OP.search(t)] if m]
    root = chain[-1]
    first = next((ln.strip() for ln in texts[-1].splitlines() if ln.strip()), type(root).__name__)
    where = (f" in {module}" if module else "") + (f" at {ops[0]}" if ops else "")
    return f"{stage} of {info.name} ({info.model_type}) failed{where}: {type(root).__name__}: {first[:300]}"
