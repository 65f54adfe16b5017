#!/usr/bin/env bash
# Runs a command as AVX2-only cores (AMD EPYC-Rome: no AVX-512, no bf16 or AMX
# instructions) run it, natively, on any x86 machine whose kernel offers CPUID faulting
# (the cpuid_fault flag):
# - tools/avx2_cpuid.c, preloaded into every process the command starts, answers each
#   CPUID instruction as Rome would, so TensorFlow, oneDNN and XLA's LLVM pick the
#   kernels and code they pick on such cores, as on a cloud VM with Rome's CPU model;
# - glibc, which reads CPUID before the preload runs, is told the same by GLIBC_TUNABLES;
# - /proc/cpuinfo is shown without the flags Rome lacks, so that keras_vit.hardware and
#   `--precision=auto` see such cores too.
# The instructions the cores have but do not announce stay unused, as they do under a VM.
# E.g.
#   tools/as_avx2.sh make test
# Needs root (a private mount namespace) and gcc.
set -euo pipefail
if [ $# -eq 0 ]; then echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; fi
# Inside a command this script runs, the cores already look like AVX2-only ones.
if [ -n "${KERAS_VIT_AS_AVX2:-}" ]; then exec "$@"; fi
if ! grep -qw cpuid_fault /proc/cpuinfo; then
  echo "$0: this kernel offers no CPUID faulting (no cpuid_fault in /proc/cpuinfo)" >&2; exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
gcc -O2 -Wall -shared -fPIC -o "$work/avx2_cpuid.so" "$here/avx2_cpuid.c" -ldl
sed -E 's/ (avx512[a-z0-9_]*|amx_[a-z0-9_]+|avx_vnni|gfni|vaes|vpclmulqdq)\b//g' /proc/cpuinfo > "$work/cpuinfo"
export LD_PRELOAD="$work/avx2_cpuid.so${LD_PRELOAD:+:$LD_PRELOAD}"
export KERAS_VIT_AS_AVX2=1
export GLIBC_TUNABLES=glibc.cpu.hwcaps=-AVX512F,-AVX512VL,-AVX512BW,-AVX512DQ,-AVX512CD
unshare --mount --propagation private bash -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' \
  "$work/cpuinfo" "$@"
