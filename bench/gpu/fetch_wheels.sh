#!/usr/bin/env bash
# Put into .whl/ (git-ignored by .gitignore; a device run carries it) the only
# wheels the GPU machine lacks: nvshmem4py-cu13, mpi4py and mpich for its Python 3.12,
# from ../shared/wheels/gpu-py312. Everything else (pytest, scipy, numba, matplotlib,
# tqdm, cupy, cuda-core, torch) is on the machine's image, and other versions of those
# first on PYTHONPATH can break its pytest plugins, so nothing else goes first.
#
# .whl/fallback/ gets cuda-core and cuda-pathfinder wheels (about 7 MB), which
# bench/gpu/stage.py installs only if nvshmem4py does not import with the image's own
# (nvshmem4py 0.4.1 needs cuda.core >= 0.5), and .whl/extra/ what a window's steps need
# that the image lacks: pymetis (0.3 MB; METIS built in, needs only typing-extensions,
# which torch needs too), for --order metis. Pass --no-fallback to skip both (no
# package registry needed then).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=../shared/wheels/gpu-py312
mkdir -p .whl
rm -f .whl/*.whl
for name in nvshmem4py mpi4py mpich; do
  found=("$src"/"$name"*-*.whl)
  if [ ! -e "${found[0]}" ] || [ "${#found[@]}" -ne 1 ]; then
    echo "fetch_wheels: need exactly one $name wheel in $src" >&2
    exit 1
  fi
  cp "${found[0]}" .whl/
done
if [ "${1:-}" != "--no-fallback" ]; then
  mkdir -p .whl/fallback
  python3 -m pip download -q --dest .whl/fallback --only-binary=:all: --no-deps \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 "cuda-core>=0.5,<2" "cuda-pathfinder>=1.2.3" \
    2>&1 | grep -v '^WARNING: Location' || true
  mkdir -p .whl/extra
  rm -f .whl/extra/*.whl
  python3 -m pip download -q --dest .whl/extra --only-binary=:all: --no-deps \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_24_x86_64 "pymetis==2025.2.2" \
    2>&1 | grep -v '^WARNING: Location' || true
fi
ls -la .whl .whl/fallback .whl/extra 2>/dev/null
du -sh .whl
