"""What a job will hold per rank, before it allocates: the footprint model (estimate: the
parts and their calibration) and the memory plan over a budget (plan: fits, fixes, and
what it decides for a Job). Above the layers whose costs it models; what a rank has is
mgg.memory's."""

from .estimate import Parts, check_estimate, estimate
from .plan import (
    check_host,
    check_job,
    checked_estimate,
    fixes,
    job_estimate,
    job_kw,
    model_params,
    plan,
    planned,
    rank_rows,
    stream_rows,
)

__all__ = [
    "Parts",
    "check_estimate",
    "check_host",
    "check_job",
    "checked_estimate",
    "estimate",
    "fixes",
    "job_estimate",
    "job_kw",
    "model_params",
    "plan",
    "planned",
    "rank_rows",
    "stream_rows",
]
