"""Progress bars for long work, shown by one process only."""

from __future__ import annotations

import os
import sys


def is_lead_rank() -> bool:
    """True on rank 0 of an MPI job (read from the launcher's environment) or alone."""
    for var in ("MGG_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return os.environ[var] == "0"
    return True


def progress(iterable=None, *, total=None, desc=None, enable=None, unit="it"):
    """tqdm over ``iterable`` on the lead rank when stderr is a terminal, else silent.

    ``enable`` forces it on or off; MGG_PROGRESS=1/0 does the same from outside.
    """
    from tqdm.auto import tqdm

    if enable is None:
        env = os.environ.get("MGG_PROGRESS")
        enable = env == "1" if env in ("0", "1") else sys.stderr.isatty()
    enable = enable and is_lead_rank()
    return tqdm(
        iterable,
        total=total,
        desc=desc,
        disable=not enable,
        unit=unit,
        dynamic_ncols=True,
        leave=False,
    )
