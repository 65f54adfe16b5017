"""keras_vit.hardware: what the precision policy, the layers' forms and the tests ask of the machine."""

import os
import re
import shutil
import signal
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


CPUID_PROBE = r"""
#include <cpuid.h>
#include <stdio.h>
int main(void) {
  unsigned a, b, c, d, bf16 = 0;
  __cpuid_count(7, 0, a, b, c, d);
  unsigned avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, amx_bf16 = (d >> 22) & 1;
  if (a >= 1) { unsigned a1, b1, c1, d1; __cpuid_count(7, 1, a1, b1, c1, d1); bf16 = (a1 >> 5) & 1; }
  printf("avx2=%u avx512f=%u avx512_bf16=%u amx_bf16=%u\n", avx2, avx512f, bf16, amx_bf16);
  return 0;
}
"""


@pytest.mark.skipif(not (shutil.which("gcc") and "cpuid_fault" in hardware.cpu_flags() and os.geteuid() == 0),
                    reason="tools/as_avx2.sh needs gcc, root and a kernel with CPUID faulting (cpuid_fault)")
def test_as_avx2_shows_any_cores_as_avx2_only_cores(tmp_path):
    """tools/as_avx2.sh, how the suite runs as AVX2-only cores run it: CPUID, which TF,
    oneDNN and XLA read, and /proc/cpuinfo, which keras_vit.hardware reads, say AVX2 and
    nothing newer, in every program the command starts; a crash still reaches
    the program's own SIGSEGV handler."""
    tool = os.path.join(ROOT, "tools", "as_avx2.sh")
    (tmp_path / "probe.c").write_text(CPUID_PROBE)
    subprocess.run(["gcc", "-o", str(tmp_path / "probe"), str(tmp_path / "probe.c")], check=True)
    probe = subprocess.run([tool, str(tmp_path / "probe")], capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "avx2=1 avx512f=0 avx512_bf16=0 amx_bf16=0"

    # TF turns its oneDNN on by default only for cores with AVX512_VNNI, AVX512_BF16,
    # AVX_VNNI or AMX, by CPUID: off here, as on AVX2-only cores.
    code = 'from keras_vit import hardware; print(hardware.describe(), hardware.onednn_runs("float32"))'
    env = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    env.update(PYTHONPATH=ROOT, CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([tool, sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["AVX2", "False"]

    segfault = "import ctypes; ctypes.string_at(0)"
    crash = subprocess.run([tool, sys.executable, "-X", "faulthandler", "-c", segfault], capture_output=True,
                           text=True, timeout=60)
    # Killed by SIGSEGV: the script's status, or the process's own where the script
    # runs inside a command it runs (and so execs the command).
    assert crash.returncode in (128 + signal.SIGSEGV, -signal.SIGSEGV), crash.returncode
    assert "Fatal Python error: Segmentation fault" in crash.stderr
