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
# With --current, makes .venv-current match requirements/current-lock.txt instead: the
# model package on today's stack (Python 3.12, the newest TensorFlow and Keras, no TFX),
# where `make test` runs the model package's tests a second time.
#
# --print-venv prints the environment's directory and changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

stack=pinned
if [ "${1:-}" = "--current" ]; then
  stack=current
  shift
fi
lock=requirements/lock.txt
python_version=3.10
link=.venv
name=venv
if [ "$stack" = current ]; then
  lock=requirements/current-lock.txt
  python_version=3.12
  link=.venv-current
  name=venv-current
fi
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
# The CUDA pins are TensorFlow 2.16's; the current stack is tested on the CPU only.
[ "$gpu" = 1 ] && [ "$stack" = pinned ] && locks+=(requirements/gpu-lock.txt)
# The key covers this script too, so a change to how the env is built rebuilds it.
hash=$(cat "${locks[@]}" "$0" | sha256sum | cut -c1-16)
cache_root=${KERAS_VIT_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keras-vit}
venv="$cache_root/$name-$hash"
if [ "${1:-}" = "--print-venv" ]; then
  echo "$venv"
  exit 0
fi

find_python() {
  local candidate v=$python_version
  for candidate in "${PYTHON:-}" "python$v" "$HOME"/.pyenv/versions/"$v".*/bin/"python$v" "/usr/bin/python$v" \
      "/usr/local/bin/python$v"; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c "import sys; assert '%d.%d' % sys.version_info[:2] == '$v'" 2>/dev/null; then
      command -v "$candidate" || echo "$candidate"
      return 0
    fi
  done
  # pyenv installs Pythons without putting them first on PATH; ask pyenv directly.
  if command -v pyenv >/dev/null; then
    for candidate in $(pyenv versions --bare | grep "^$v\\."); do
      candidate="$(pyenv root)/versions/$candidate/bin/python$v"
      [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
  fi
  if [ "$stack" = current ]; then
    echo "error: Python $v is required for $lock (the model package on today's stack)." >&2
  else
    echo "error: Python $v is required (TFX 1.16 has no wheels for other versions here)." >&2
  fi
  echo "       Install it (e.g. 'pyenv install $v') or set PYTHON=/path/to/python$v." >&2
  return 1
}

if [ ! -f "$venv/.lock-installed" ]; then
  py=$(find_python)
  if [ "$gpu" = 1 ]; then
    echo "With TensorFlow's CUDA libraries (requirements/gpu-lock.txt, about 3 GB more): $why"
  fi
  echo "Creating the environment for $lock ($hash) in $venv (a few minutes, 2-4 GB)..."
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

if [ "$(readlink "$link" 2>/dev/null)" != "$venv" ]; then
  rm -rf "$link"
  ln -s "$venv" "$link"
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
