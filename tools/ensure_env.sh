#!/usr/bin/env bash
# Makes .venv match requirements/lock.txt and installs the offline data set.
# With --bench, also installs the benchmark-only extra (requirements/bench-lock.txt:
# keras-hub to compare against) into .venv-bench, a directory for PYTHONPATH, so
# that the main environment never holds it.
#
# On a host with an NVIDIA GPU (nvidia-smi lists one), the environment also holds
# TensorFlow's CUDA libraries (requirements/gpu-lock.txt); KERAS_VIT_GPU=1 or 0
# overrides the detection.
#
# The 3.4 GB environment lives in a cache directory keyed by the locks' hash and
# .venv is a symlink to it, so a fresh clone (CI's included) reuses an existing
# install instead of spending five minutes repeating it.
#
# --print-venv prints the environment's directory and changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

lock=requirements/lock.txt
gpu=${KERAS_VIT_GPU:-auto}
why="KERAS_VIT_GPU=$gpu"
if [ "$gpu" = auto ]; then
  gpu=0
  if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    gpu=1
    why="nvidia-smi lists a GPU"
  fi
elif [ "$gpu" != 0 ] && [ "$gpu" != 1 ]; then
  echo "error: KERAS_VIT_GPU must be 0, 1 or auto, got '$gpu'" >&2
  exit 2
fi
locks=("$lock")
[ "$gpu" = 1 ] && locks+=(requirements/gpu-lock.txt)
# The key covers this script too, so a change to how the env is built rebuilds it.
hash=$(cat "${locks[@]}" "$0" | sha256sum | cut -c1-16)
cache_root=${KERAS_VIT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keras-vit}
venv="$cache_root/venv-$hash"
if [ "${1:-}" = "--print-venv" ]; then
  echo "$venv"
  exit 0
fi

find_python() {
  local candidate
  for candidate in "${PYTHON:-}" python3.10 "$HOME"/.pyenv/versions/3.10*/bin/python3.10 /usr/bin/python3.10 /usr/local/bin/python3.10; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 10)' 2>/dev/null; then
      command -v "$candidate" || echo "$candidate"
      return 0
    fi
  done
  # pyenv installs 3.10 without putting it first on PATH; ask pyenv directly.
  if command -v pyenv >/dev/null; then
    for v in $(pyenv versions --bare | grep '^3\.10'); do
      candidate="$(pyenv root)/versions/$v/bin/python3.10"
      [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
  fi
  echo "error: Python 3.10 is required (TFX 1.16 has no wheels for other versions here)." >&2
  echo "       Install it (e.g. 'pyenv install 3.10') or set PYTHON=/path/to/python3.10." >&2
  return 1
}

if [ ! -f "$venv/.lock-installed" ]; then
  py=$(find_python)
  if [ "$gpu" = 1 ]; then
    echo "With TensorFlow's CUDA libraries (requirements/gpu-lock.txt, about 3 GB more): $why"
  fi
  echo "Creating the environment for lock $hash in $venv (about 5 minutes, 3.4 GB)..."
  # Installed in place (console scripts hard-code their interpreter's path); the
  # stamp written last marks it complete, so an interrupted install is redone.
  rm -rf "$venv"
  mkdir -p "$cache_root"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check uv==0.13.9
  # --no-deps with a fully pinned lock: nothing left for a resolver to backtrack on.
  requirements=()
  for l in "${locks[@]}"; do requirements+=(-r "$l"); done
  "$venv/bin/uv" pip install --quiet --no-deps --python "$venv/bin/python" "${requirements[@]}"
  touch "$venv/.lock-installed"
fi

if [ "$(readlink .venv 2>/dev/null)" != "$venv" ]; then
  rm -rf .venv
  ln -s "$venv" .venv
fi
fmnist=/usr/share/datasets/fashion-mnist
if [ ! -f "$fmnist/train-images-idx3-ubyte.gz" ] && [ -z "${KERAS_VIT_SKIP_APT:-}" ]; then
  echo "Installing Fashion-MNIST from Debian's dataset-fashion-mnist..."
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null
fi

if [ "${1:-}" = "--bench" ]; then
  bench_lock=requirements/bench-lock.txt
  bench_hash=$(cat "$lock" "$bench_lock" "$0" | sha256sum | cut -c1-16)
  bench="$cache_root/bench-$bench_hash"
  if [ ! -f "$bench/.lock-installed" ]; then
    echo "Installing the benchmark extra ($bench_lock) into $bench..."
    rm -rf "$bench"
    "$venv/bin/uv" pip install --quiet --no-deps --python "$venv/bin/python" --target "$bench" -r "$bench_lock"
    touch "$bench/.lock-installed"
  fi
  if [ "$(readlink .venv-bench 2>/dev/null)" != "$bench" ]; then
    rm -rf .venv-bench
    ln -s "$bench" .venv-bench
  fi
fi
