"""Process-wide allocator setting for the many same-sized temporaries of a training step."""

from __future__ import annotations

import ctypes


def tune_malloc(threshold: int = 1 << 30) -> bool:
    """Keep freed memory in the process (glibc ``mallopt``: ``M_MMAP_THRESHOLD`` and
    ``M_TRIM_THRESHOLD`` raised to ``threshold`` bytes), so that the large temporaries
    of every step are not unmapped and then page-faulted back in (hundreds of minor
    faults a step). Process-wide: the ``microgpt-xp`` command sets it for itself, and
    the benchmark for our code and the peers alike; a library call never changes it.
    Returns whether it could be done (False off glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError, TypeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, threshold)) and bool(mallopt(m_trim_threshold, threshold))
