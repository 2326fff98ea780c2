"""Entry point: `python -m trt_seer --help`."""
import sys

from trt_seer.cli import main

sys.exit(main())
