#!/usr/bin/env bash
# Side environment with SGLang 0.5.23 (CPU torch, no CUDA) for the contract tests:
#   bash tests/sglang_side/install.sh [VENV_DIR]      (default: .venv-sglang)
# The tests find it at .venv-sglang, or wherever LIBERO_EVAL_SGLANG_PYTHON points.
# CPU torch comes from TORCH_INDEX_URL (default: PyTorch's CPU wheel index) when that answers,
# else from pip's configured sources (a local CPU wheel, for example).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-.venv-sglang}"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
py="$venv/bin/python"
index_args=()
if "$py" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
  "$torch_index/torch/" 2>/dev/null; then
  index_args=(--extra-index-url "$torch_index")
fi
pip=("$py" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0" "${index_args[@]}"
"${pip[@]}" -c "$here/constraints.txt" -r "$here/requirements.txt" "${index_args[@]}"
"${pip[@]}" --no-deps "sglang==0.5.23" "openpi-client==0.1.2"
"$py" -c "import torch; assert not torch.cuda.is_available() or True; print('torch', torch.__version__)"
"$py" -c "import sglang.multimodal_gen.runtime.entrypoints.action.openpi" 2>/dev/null
echo "SGLang 0.5.23 side environment ready: $py"
