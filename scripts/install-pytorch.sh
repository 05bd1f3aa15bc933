#!/usr/bin/env bash
# Installs the PyTorch 2.x that the `TORCH=pytorch` build compiles against, in a virtual
# environment of its own (no system Python changes); does nothing when it is already there.
# Usage: install-pytorch.sh <venv dir> <torch version>
#
# The version is pinned to what our GPU machines run: PyTorch 2.11.0, whose PyPI wheel for Linux
# is built with CUDA 13.0 (its cuda-toolkit 13.0.2, cuDNN 9.19, NCCL 2.28 come as pip packages).
# The wheel's LibTorch (torch/share/cmake) is what CMake finds; the CUDA toolkit CMake also needs
# (nvcc, the CUDA headers) is the system one.
set -euo pipefail
venv=${1:?usage: install-pytorch.sh <venv dir> <torch version>}
version=${2:?usage: install-pytorch.sh <venv dir> <torch version>}
python=/usr/bin/python3   # Debian's: a venv of it needs python3-venv (scripts/install-deps.sh)

installed=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [[ ${installed%%+*} == "$version" ]]; then
  exit 0
fi
echo "Installing PyTorch $version (CUDA build from PyPI) into $venv"
if [[ ! -x $venv/bin/python ]]; then
  "$python" -m venv "$venv"
fi
# numpy only silences torch's import warning; nothing of remat's uses it.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "torch==$version" numpy
"$venv/bin/python" -c 'import torch; print("PyTorch", torch.__version__, "CUDA", torch.version.cuda)'
