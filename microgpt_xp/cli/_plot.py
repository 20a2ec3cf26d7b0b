"""``--plot FILE``: the loss curve of a training run (needs matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


def check_plot(path: str | None) -> None:
    """Fail before training if ``--plot`` cannot be written (matplotlib missing, an image
    format it does not know, a folder that does not exist)."""
    if path is None:
        return
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        from .._backends import install_extra

        raise ImportError(f"--plot needs matplotlib: {install_extra('plot')} ({exc})") from exc
    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasAgg.get_supported_filetypes()
    if suffix not in formats:
        raise ValueError(
            f"--plot {path!r}: unsupported image format {suffix!r}; use one of "
            f"{', '.join(sorted(formats))}"
        )
    parent = Path(path).parent
    if not parent.is_dir():
        raise FileNotFoundError(f"--plot {path!r}: folder {str(parent)!r} does not exist")


def plot_losses(
    path: str,
    losses: Sequence[float],
    first_step: int,
    title: str,
    val_losses: Sequence[tuple[int, float]] = (),
) -> None:
    """Save the per-step losses (step ``first_step + 1`` first), their running mean and the
    held-out losses ``(step, loss)``, written atomically."""
    import io

    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .._files import atomic_write

    # No pyplot: a bare Figure on an Agg canvas leaves matplotlib's global state alone.
    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = np.arange(first_step + 1, first_step + len(losses) + 1)
    ax.plot(steps, losses, lw=0.6, alpha=0.5, label="batch loss")
    window = max(1, len(losses) // 50)
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, lw=1.5, label=f"mean of {window} steps")
    if val_losses:
        at, value = zip(*val_losses, strict=True)
        ax.plot(at, value, "o-", lw=1.5, ms=3, label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=Path(path).suffix.lstrip(".").lower())
    atomic_write(path, buf.getvalue())
