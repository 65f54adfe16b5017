"""keras_vit.hardware: what the precision policy, the layers' forms and the tests ask of the machine."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

from keras_vit import hardware

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("flags, kind, instructions", [
    ({"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}, "AMX", ("amx_bf16", "avx512_bf16")),
    ({"avx2", "avx512f", "avx512_bf16"}, "AVX-512 with AVX512-BF16", ("avx512_bf16",)),
    ({"avx2", "avx512f", "avx512_vnni"}, "AVX-512", ()),
    ({"avx2", "fma"}, "AVX2", ()),
    (set(), "x86 without AVX2", ()),
])
def test_kinds_of_cores_from_their_flags(flags, kind, instructions):
    assert hardware.describe(flags) == kind
    assert hardware.bf16_instructions(flags) == instructions
    # bf16 is fast only with the instructions and with TF's oneDNN running bfloat16.
    assert hardware.has_fast_bf16_cpu(flags, onednn_bf16=True) is bool(instructions)
    assert hardware.has_fast_bf16_cpu(flags, onednn_bf16=False) is False


def test_a_run_records_the_cores_it_may_use_and_their_kind(monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    core = "core" if cpus == 1 else "cores"
    assert re.fullmatch(rf"{cpus} {re.escape(hardware.describe())} {core}(, \d+ GPUs?)?", hardware.machine())
    # A process pinned to one core (as experiments run side by side are) says so.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert re.fullmatch(rf"1 {re.escape(hardware.describe())} core(, \d+ GPUs?)?", hardware.machine())


def test_cpu_flags_read_the_kernels_list(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 amx_bf16\n\n"
                       "processor\t: 1\nflags\t\t: fpu avx2 amx_bf16\n")
    assert hardware.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "amx_bf16"}
    assert hardware.cpu_flags(str(tmp_path / "missing")) == frozenset()


def _in_a_fresh_process(env_opts):
    """What a new process reports, with TF_ENABLE_ONEDNN_OPTS set to `env_opts` (TF
    reads it once per process)."""
    code = textwrap.dedent("""
        from keras_vit import hardware
        from keras_vit.precision import set_precision
        print(hardware.onednn_runs("float32"), hardware.onednn_runs("bfloat16"))
        set_precision("auto")
    """)
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": env_opts, "PYTHONPATH": ROOT, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


def test_onednn_follows_tensorflows_switch_and_auto_precision_follows_it():
    """With TF's oneDNN off, no graph form is taken for it and `auto` keeps float32
    (bf16 would run on Eigen's emulation), saying why; with it on, float32 always runs
    on oneDNN, and bfloat16 where these cores have AVX-512."""
    runs, precision = _in_a_fresh_process("0")
    assert runs == "False False"
    if hardware.bf16_instructions():
        assert precision == ("precision: float32 (auto: no GPU, and TF's oneDNN does not run "
                             "bfloat16 here (TF_ENABLE_ONEDNN_OPTS=0?))")
    else:
        assert precision == (f"precision: float32 (auto: no GPU, and {hardware.describe()} cores "
                             "have no AMX-BF16 or AVX512-BF16)")
    runs, precision = _in_a_fresh_process("1")
    f32, bf16 = runs.split()
    assert f32 == "True" and bf16 == str("avx512f" in hardware.cpu_flags())
    fast = hardware.has_fast_bf16_cpu(onednn_bf16=bf16 == "True")
    assert precision.startswith("precision: mixed_bfloat16" if fast else "precision: float32")
