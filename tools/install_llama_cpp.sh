#!/usr/bin/env bash
# Installs llama-cpp-python (PyPI's sdist, which builds llama.cpp itself: about 10 minutes
# on 2 cores) into .venv-tools/ (git-ignored), the independent GGUF reader the GGUF checks
# and the LLM example use (docs/GGUF.md, "Checked by llama.cpp"). CI does not run this; the
# checks skip, saying so, where llama_cpp cannot be imported.
#
#   bash tools/install_llama_cpp.sh [--version X.Y.Z]
#
# The venv sees the system's site-packages (torch, transformers, gguf when python3 has
# them), so one interpreter, .venv-tools/bin/python, has them all.
set -euo pipefail
cd "$(dirname "$0")/.."
version=""
case "${1:-}" in
  --version) version="==${2:?--version needs a value}" ;;
  -h | --help)
    sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  "") ;;
  *)
    echo "install_llama_cpp.sh: unknown option '$1' (--version X.Y.Z, --help)" >&2
    exit 2
    ;;
esac

py=.venv-tools/bin/python
if [ ! -x "$py" ]; then
  if ! python3 -c "import ensurepip" 2>/dev/null; then  # Debian ships venv apart
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends python3-venv
  fi
  python3 -m venv --system-site-packages .venv-tools
fi
if "$py" -c "import llama_cpp" 2>/dev/null; then
  echo "llama-cpp-python already in .venv-tools ($("$py" -c 'import llama_cpp; print(llama_cpp.__version__)'))"
  exit 0
fi
command -v cmake >/dev/null || { echo "install_llama_cpp.sh: needs cmake (apt-get install cmake)" >&2; exit 2; }
# CPU only: llama.cpp's default build for this CPU (GGML_NATIVE), every core.
echo "building llama.cpp through llama-cpp-python$version (about 10 minutes on 2 cores)"
CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="-DGGML_CUDA=OFF -DLLAMA_CURL=OFF" \
  "$py" -m pip install --quiet --no-cache-dir "llama-cpp-python$version"
"$py" -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'in .venv-tools')"
