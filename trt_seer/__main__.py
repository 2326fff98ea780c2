"""Entry point: `python -m trt_seer --help`."""
import sys

from trt_seer.cli import main

if __name__ == "__main__":  # not when a spawned worker process imports this module
    sys.exit(main())
