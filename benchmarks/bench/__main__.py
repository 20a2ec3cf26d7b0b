"""``python -m benchmarks.bench``."""

from . import main

raise SystemExit(main())
