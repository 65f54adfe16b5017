#!/usr/bin/env bash
# Runs a command on AMX cores as cores with AVX-512 and AVX512-BF16 but no AMX run it:
# oneDNN capped at the ISA just below AMX (avx512_core_fp16: TF, which reads the cores
# itself, still hands float16 to oneDNN, and a cap below that leaves TF no kernel), and
# /proc/cpuinfo without the amx flags, so that keras_vit.hardware sees such cores too.
# The instructions are the real ones; only AMX is hidden. Needs root (a private mount
# namespace), e.g.
#   tools/without_amx.sh make test
set -euo pipefail
if [ $# -eq 0 ]; then echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; fi
if ! grep -qw amx_bf16 /proc/cpuinfo; then
  echo "$0: these cores have no AMX; run the command as it is" >&2; exit 2
fi
masked=$(mktemp)
trap 'rm -f "$masked"' EXIT
sed -E 's/ amx_[a-z0-9_]+//g' /proc/cpuinfo > "$masked"
export ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16
unshare --mount --propagation private bash -c 'mount --bind "$0" /proc/cpuinfo && exec "$@"' "$masked" "$@"
