"""What this machine runs fast: the one place that `--precision=auto`, the layers'
graph forms and the tests ask.

Two different questions, both asked of TensorFlow where it can answer them:
- Does TF hand this graph's ops to oneDNN? Only where its oneDNN switch is on
  (`TF_ENABLE_ONEDNN_OPTS`; by default on for cores with AVX512_VNNI, AVX512_BF16,
  AVX_VNNI or AMX, so *off* on AVX2-only cores) and oneDNN takes the dtype there
  (bfloat16 needs AVX-512). Elsewhere TF runs its Eigen kernels, and the graph forms
  written for oneDNN's rewrites would only cost time.
- Are there bf16 instructions? AMX-BF16 or AVX512-BF16. Without them oneDNN still
  runs bfloat16 on AVX-512 cores, but emulated and slower than float32.
"""

from __future__ import annotations

import functools
import os

import tensorflow as tf

# /proc/cpuinfo's names for AMX-BF16 and AVX512-BF16.
FAST_BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset:
    """The CPU's feature flags as the kernel reports them (empty where it does not)."""
    try:
        with open(path) as f:  # a file of the OS, not a user's path
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def bf16_instructions(flags=None) -> tuple:
    """The bf16 instruction sets of the CPU (`flags`, default this machine's): a
    sub-tuple of `FAST_BF16_CPU_FLAGS`, empty where bf16 arithmetic is emulated."""
    flags = cpu_flags() if flags is None else flags
    return tuple(f for f in FAST_BF16_CPU_FLAGS if f in flags)


@functools.lru_cache(maxsize=None)
def onednn_runs(dtype="float32") -> bool:
    """True where TF rewrites CPU graphs of `dtype` into oneDNN ops: its oneDNN switch
    is on, oneDNN takes `dtype` on these cores, and no GPU takes the graph instead.
    Both answers are TensorFlow's own (the switch is read once per process)."""
    from tensorflow.python.util import _pywrap_util_port, _pywrap_utils

    if not _pywrap_util_port.IsMklEnabled() or tf.config.list_logical_devices("GPU"):
        return False
    return bool(_pywrap_utils.IsDataTypeSupportedByOneDNNOnThisCPU(tf.as_dtype(dtype)))


def has_fast_bf16_cpu(flags=None, onednn_bf16=None) -> bool:
    """bf16 instructions (AMX-BF16 or AVX512-BF16) that TF reaches: oneDNN runs
    bfloat16 here (2-4x float32 on AMX). `flags` and `onednn_bf16` default to this
    machine's (`cpu_flags()`, `onednn_runs("bfloat16")`)."""
    if not bf16_instructions(flags):
        return False
    return onednn_runs("bfloat16") if onednn_bf16 is None else bool(onednn_bf16)


def describe(flags=None) -> str:
    """The kind of cores, as the README names them: "AMX", "AVX-512 with AVX512-BF16",
    "AVX-512", "AVX2" or "x86 without AVX2" (for `flags`, default this machine's)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX-512 with AVX512-BF16"
    if "avx512f" in flags:
        return "AVX-512"
    return "AVX2" if "avx2" in flags else "x86 without AVX2"


def machine() -> str:
    """What a run ran on, for its records: e.g. "2 AMX cores" or "8 AVX2 cores, 1 GPU"."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpus = len(tf.config.list_physical_devices("GPU"))
    cores = f"{cpus} {describe()} core{'s' if cpus > 1 else ''}"
    return cores + (f", {gpus} GPU{'s' if gpus > 1 else ''}" if gpus else "")
