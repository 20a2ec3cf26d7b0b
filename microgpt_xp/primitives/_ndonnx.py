"""ndonnx's overrides of :mod:`microgpt_xp.primitives`: the forms that export as fewer or
cheaper ONNX nodes than the generic code (measured: benchmarks/onnx_graphs.py)."""

from __future__ import annotations

# -- the forward and training graphs ------------------------------------------------------

# -- decoding (the decode and generate graphs) --------------------------------------------
