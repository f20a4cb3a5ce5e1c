"""``python -m qwen38build``."""

import sys

from qwen38build.cli import main

raise SystemExit(main(sys.argv[1:]))
