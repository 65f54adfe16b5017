#!/usr/bin/env bash
# Runs a python command as AVX2-only cores (AMD EPYC-Rome: no AVX-512, no bf16
# instructions) run it, on any x86 machine: the process runs under qemu-user, whose CPUID
# is EPYC-Rome's, so TF and oneDNN pick their AVX2 kernels, and /proc/cpuinfo is shown
# without the avx512 and amx flags, so that keras_vit.hardware sees such cores too.
# The instructions are emulated (tens of times slower), and a subprocess the command
# starts runs natively: qemu-user does not follow exec. So point it at test files that
# stay in one process, e.g.
#   tools/as_avx2.sh .venv/bin/python -m pytest -n 0 -p no:cacheprovider tests/test_layers.py -rs
# Needs root (a private mount namespace) and Debian's qemu-user.
set -euo pipefail
if [ $# -eq 0 ]; then echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; fi
if ! command -v qemu-x86_64 > /dev/null; then
  echo "$0: qemu-x86_64 not found; apt-get install qemu-user" >&2; exit 2
fi
masked=$(mktemp)
trap 'rm -f "$masked"' EXIT
sed -E 's/ (avx512[a-z0-9_]*|amx_[a-z0-9_]+)//g' /proc/cpuinfo > "$masked"
program=$(command -v "$1"); shift
unshare --mount --propagation private bash -c \
  'mount --bind "$0" /proc/cpuinfo && exec qemu-x86_64 -cpu EPYC-Rome "$@" 2> >(grep -v "^qemu-x86_64: warning: TCG" >&2)' \
  "$masked" "$program" "$@"
