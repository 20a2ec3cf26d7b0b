"""Process-wide allocator setting for the many same-sized temporaries of a training step."""

from __future__ import annotations

import ctypes


def tune_malloc(threshold: int = 1 << 30) -> bool:
    """Keep freed memory in the process (glibc ``mallopt``: mmap and trim thresholds raised to
    ``threshold`` bytes), so a step's temporaries are not page-faulted back in. Process-wide:
    the command and the benchmark set it, a library call never. False off glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, threshold)) and bool(mallopt(m_trim_threshold, threshold))
