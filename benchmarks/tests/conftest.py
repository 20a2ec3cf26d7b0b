"""``pytest benchmarks/tests`` (``nox -s bench``): ``benchmarks`` from this checkout."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
