"""Entry point: `python -m trt_seer --help`."""
import sys

from trt_seer.cli import main

if __name__ == "__main__":  # only when run (python -m trt_seer), not when imported
    sys.exit(main())
