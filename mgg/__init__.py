"""mgg: full-graph GNN training and inference across many devices with fine-grained
communication-computation pipelining (MGG, OSDI'23)."""

import os

# A training step alternates numba's OpenMP regions with BLAS calls. By default idle
# OpenMP threads spin for a long while, starving BLAS's threads: on 2 cores a GIN epoch
# took 7x longer (docs/runtime.md). An explicit setting of the user's wins.
os.environ.setdefault("GOMP_SPINCOUNT", "0")

__version__ = "0.1.0"
