#!/usr/bin/env bash
# Gather, on a machine with the package registries, every wheel the GPU machine lacks
# (it has no network): the shared nvshmem4py/mpi4py/mpich wheels and this project's pure
# dependencies for its Python 3.12, plus any package named as an argument (e.g. scipy, if
# the machine lacks it: `python3 -c "import scipy"` there tells). They land in .whl/
# (git-ignored, at most 64 MiB to carry), which a device run carries and installs:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
cp ../shared/wheels/gpu-py312/*.whl .whl/ 2>/dev/null || true
python3 -m pip download -q --dest .whl --only-binary=:all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --no-deps \
  tqdm pytest pluggy iniconfig packaging hypothesis sortedcontainers attrs \
  matplotlib contourpy cycler fonttools kiwisolver pillow pyparsing python-dateutil six \
  "$@"
du -sh .whl
