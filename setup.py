"""The one compiled part: runtime/_nucleus.c, the C loops of the host's sampling draws (top-p, top-k).
Optional: where no C compiler (or no Python headers) builds it, the install goes on and
runtime/sampling.py draws with numpy."""
import sys

from setuptools import Extension, setup

FLAGS = [] if sys.platform == "win32" else ["-O3", "-ffast-math"]  # -ffast-math: the loops' sums vectorize

setup(ext_modules=[Extension("trt_seer.runtime._nucleus", ["trt_seer/runtime/_nucleus.c"], extra_compile_args=FLAGS,
                             optional=True)])
