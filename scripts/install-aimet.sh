#!/usr/bin/env bash
# Installs AIMET (aimet-onnx 2.42.0) CPU-only into $PYTHON (default python3), for the `aimet`-marked
# tests (pytest tests/ -m aimet) and for computing encodings to pass with --quantization-overrides.
#
# A plain `pip install aimet-onnx` takes about 6.4 GB on Linux x86-64: onnx2torch pulls torchvision,
# which pulls a CUDA torch and about 3.2 GB of nvidia-* libraries and triton. The recipe here:
#   1. torch 2.13.0, a CPU build: from $TORCH_CPU_INDEX (default PyTorch's CPU index) when it can be
#      reached, else from pip's configured indexes (a find-links folder of CPU wheels, say);
#   2. aimet-onnx 2.42.0 with torch and torchvision pinned, so nothing replaces the CPU torch;
#   3. torchvision removed again when it cannot import (PyPI's 0.28.0 is a CUDA build that fails
#      with a CPU torch: "operator torchvision::nms does not exist"); aimet_onnx does not need it.
# Then it checks that no nvidia-* or triton wheels came in, that torch is a CPU build and that
# `import aimet_onnx` works, and fails otherwise.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
AIMET_VERSION=2.42.0 TORCH_VERSION=2.13.0 TORCHVISION_VERSION=0.28.0
pip() { "$PYTHON" -m pip "$@"; }
export PIP_CONSTRAINT="${PIP_CONSTRAINT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/constraints.txt}"  # the verified toolchain

if "$PYTHON" -c "import aimet_onnx, torch, sys; sys.exit(not (aimet_onnx.__version__ == '$AIMET_VERSION' and torch.version.cuda is None))" 2>/dev/null; then
  echo "aimet-onnx $AIMET_VERSION (CPU torch) is already installed in $PYTHON"
else
  source "$(dirname "$0")/install-cpu-torch.sh"  # sets TORCH_INDEX_ARGS
  pip install -q "${TORCH_INDEX_ARGS[@]}" "aimet-onnx==$AIMET_VERSION" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
  if ! "$PYTHON" -c "import torchvision" >/dev/null 2>&1; then
    pip uninstall -q -y torchvision  # a CUDA build beside a CPU torch; nothing AIMET's ONNX path uses
  fi
fi

# Verify: no CUDA wheels, a CPU torch, aimet_onnx imports.
cuda=$(pip list --format=freeze 2>/dev/null | grep -iE '^(nvidia-[^=]*|triton)==' || true)
if [ -n "$cuda" ]; then
  echo "install-aimet: CUDA wheels were installed (expected a CPU-only install):" >&2
  echo "$cuda" >&2
  exit 1
fi
"$PYTHON" - <<'PY'
import sys
import torch
if torch.version.cuda is not None:
    sys.exit(f"install-aimet: torch {torch.__version__} is a CUDA build (expected a CPU build)")
import aimet_onnx
from aimet_onnx.quantsim import QuantizationSimModel  # noqa: F401
print(f"install-aimet: aimet-onnx {aimet_onnx.__version__}, torch {torch.__version__} (CPU) in {sys.prefix}")
PY
