"""Fig. 10 of the paper: latency heatmaps over the tuner's search space."""

from __future__ import annotations

import numpy as np

from ..atomic import atomic_write


def heatmaps(space, table, best, path, title):
    """Fig. 10: latency over ps x dist (at the best third knob) and third knob x dist (at
    the best ps); unmeasured cells are blank. ``path`` is written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    knobs = list(space)
    third = knobs[2]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, (rows, fixed) in zip(axes, (("ps", third), (third, "ps")), strict=True):
        grid = np.full((len(space[rows]), len(space["dist"])), np.nan)
        for i, r in enumerate(space[rows]):
            for j, d in enumerate(space["dist"]):
                cfg = {"dist": d, rows: r, fixed: best[fixed]}
                grid[i, j] = table.get(tuple(cfg[k] for k in knobs), np.nan) * 1e3
        im = ax.imshow(grid, origin="lower", cmap="viridis_r", aspect="auto")
        ax.set_xticks(range(len(space["dist"])), space["dist"])
        ax.set_yticks(range(len(space[rows])), space[rows])
        ax.set_xlabel("dist")
        ax.set_ylabel(rows)
        ax.set_title(f"{rows} x dist at {fixed}={best[fixed]}")
        fig.colorbar(im, ax=ax, label="latency (ms)")
    fig.suptitle(title)
    fig.tight_layout()
    try:
        with atomic_write(path) as tmp:
            fig.savefig(tmp, dpi=110)  # tmp keeps the ending, which names the format
    finally:
        plt.close(fig)
    return path


# ---- train ---------------------------------------------------------------------------
