#!/usr/bin/env bash
# Runs a python command as AVX2-only cores (AMD EPYC-Rome: no AVX-512, no bf16
# instructions) run it, on any x86 machine: the process runs under qemu-user, whose CPUID
# is EPYC-Rome's, so TF and oneDNN pick their AVX2 kernels, and /proc/cpuinfo is shown
# without the avx512 and amx flags, so that keras_vit.hardware sees such cores too.
# The instructions are emulated (tens of times slower). qemu-user does not follow exec, so
# the interpreter is started through a shim whose path becomes sys.executable: a Python
# subprocess started as `sys.executable ...` is emulated too; any other program (a console
# script such as saved_model_cli) runs natively. E.g.
#   tools/as_avx2.sh .venv/bin/python -m pytest -n 0 -p no:cacheprovider tests/test_layers.py -rs
# An emulated export test can outlast setup.cfg's per-test timeout: pass --timeout=3600.
# Needs root (a private mount namespace) and Debian's qemu-user.
set -euo pipefail
if [ $# -eq 0 ]; then echo "usage: $0 PYTHON [ARGS...]" >&2; exit 2; fi
if ! command -v qemu-x86_64 > /dev/null; then
  echo "$0: qemu-x86_64 not found; apt-get install qemu-user" >&2; exit 2
fi
python=$(command -v "$1"); shift
{ read -r prefix; read -r real; } < <("$python" -c 'import os, sys; print(sys.prefix); print(os.path.realpath(sys.executable))')
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
sed -E 's/ (avx512[a-z0-9_]*|amx_[a-z0-9_]+)//g' /proc/cpuinfo > "$shim/cpuinfo"
# The shim is a venv of its own over the same packages: Python finds pyvenv.cfg beside
# the path qemu gives it as argv[0].
mkdir "$shim/bin"
ln -s "$prefix/lib" "$shim/lib"
if [ -f "$prefix/pyvenv.cfg" ]; then cp "$prefix/pyvenv.cfg" "$shim/"; else
  echo "home = $(dirname "$real")" > "$shim/pyvenv.cfg"; fi
cat > "$shim/bin/python" <<SHIM
#!/usr/bin/env bash
exec qemu-x86_64 -cpu EPYC-Rome -0 "\$0" "$real" "\$@" 2> >(grep -v "^qemu-x86_64: warning: TCG" >&2)
SHIM
chmod +x "$shim/bin/python"
unshare --mount --propagation private bash -c 'mount --bind "$0/cpuinfo" /proc/cpuinfo && exec "$0/bin/python" "$@"' \
  "$shim" "$@"
