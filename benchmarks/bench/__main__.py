"""``python -m benchmarks.bench``."""

import sys

from . import main

sys.exit(main())
