#!/usr/bin/env bash
# The wheels tools/gpu_step.py --whole-step needs on the lent GPU machine, downloaded here into .whl/ (ignored by
# git; the device tool carries it). That machine has Python 3.12, JAX, PyTorch and torchvision but no Keras and no
# registry: Keras 3.15.1 (the version tflms supports) travels as a wheel with the two of its requirements the machine
# lacks, namex and optree (absl-py, numpy, rich, h5py, ml-dtypes and packaging are there). About 2 MB in all.
#
#   bash tools/fetch_gpu_wheels.sh        # here, once; then the device command in tools/gpu_step.py's docstring
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
mkdir -p "$dest"
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dest" \
  keras==3.15.1 namex==0.1.0 optree==0.20.0
ls -l "$dest"
