#!/usr/bin/env bash
# Installs torch $TORCH_VERSION (default 2.13.0), a CPU build, into $PYTHON (default python3), before anything
# asks for torch: a plain `torch` or a range such as the llm-reference extra's `torch>=2.4`, with no torch
# installed, takes PyPI's CUDA build on Linux x86-64 (about 3.2 GB of nvidia-* and triton wheels), which the
# AIMET install then refuses. A torch already installed as a CPU build is kept.
# Sourced by install-test-deps.sh and install-aimet.sh; sets the pip index options it used in
# TORCH_INDEX_ARGS (PyTorch's CPU index when it can be reached, else pip's configured indexes).
set -euo pipefail
PYTHON="${PYTHON:-python3}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX-https://download.pytorch.org/whl/cpu}"
TORCH_INDEX_ARGS=()
if [ -n "$TORCH_CPU_INDEX" ] && "$PYTHON" - "$TORCH_CPU_INDEX" <<'PY'
import sys, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10).close()
except Exception as e:
    print(f"install-cpu-torch: {sys.argv[1]} cannot be reached ({e}); using pip's configured indexes", file=sys.stderr)
    sys.exit(1)
PY
then
  TORCH_INDEX_ARGS=(--extra-index-url "$TORCH_CPU_INDEX")
fi
if "$PYTHON" -c "import torch, sys; sys.exit(not (torch.__version__.split('+')[0] == '$TORCH_VERSION' and torch.version.cuda is None))" 2>/dev/null; then
  echo "install-cpu-torch: torch $TORCH_VERSION (CPU) is already installed in $PYTHON"
else
  "$PYTHON" -m pip install -q "${TORCH_INDEX_ARGS[@]}" "torch==$TORCH_VERSION"
  "$PYTHON" -c "import torch, sys; sys.exit(f'install-cpu-torch: torch {torch.__version__} is a CUDA build (expected a CPU build)' if torch.version.cuda else None)"
fi
