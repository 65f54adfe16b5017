"""tools/ensure_env.sh: which environment a host gets, and the GPU extra's pins."""

import importlib.metadata
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pins(path):
    with open(os.path.join(ROOT, path)) as f:
        return dict(line.strip().split("==") for line in f if re.match(r"^[A-Za-z0-9]", line))


def test_the_gpu_lock_pins_tensorflows_own_cuda_libraries():
    """TensorFlow loads them through a RUNPATH relative to itself and was built against
    these versions: the lock must hold exactly its `and-cuda` extra."""
    wanted = {}
    for requirement in importlib.metadata.requires("tensorflow"):
        match = re.match(r"^(\S+) ?==([\w.]+) ?; extra == .and-cuda.$", requirement)
        if match:
            wanted[match.group(1)] = match.group(2)
    assert wanted, "tensorflow declares no and-cuda extra"
    assert _pins("requirements/gpu-lock.txt") == wanted
    assert importlib.metadata.version("tensorflow") in open(os.path.join(ROOT, "requirements/gpu.in")).read()
    assert not set(wanted) & set(_pins("requirements/lock.txt"))


@pytest.fixture
def checkout(tmp_path):
    """The script and the locks, copied: it reads them relative to itself."""
    for folder in ("tools", "requirements"):
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder)
    return tmp_path


def _venv(tmp_path, gpu_listing=None, **env):
    """The environment the copy of ensure_env.sh in `tmp_path` picks, with a stand-in
    nvidia-smi that prints `gpu_listing` (none on PATH when it is None)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu_listing is None:
        smi.unlink(missing_ok=True)
    else:
        smi.write_text(f"#!/bin/sh\nprintf '{gpu_listing}'\n")
        smi.chmod(0o755)
    run = subprocess.run(["bash", str(tmp_path / "tools/ensure_env.sh"), "--print-venv"], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin", "KERAS_VIT_VENV_CACHE": "/c",
                              "KERAS_VIT_GPU": "auto", **env})
    return run.stdout.strip() if run.returncode == 0 else (run.returncode, run.stderr.strip())


def test_a_host_with_a_gpu_gets_the_environment_with_cuda_libraries(checkout):
    cpu = _venv(checkout)
    gpu = _venv(checkout, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n")
    assert cpu.startswith("/c/venv-") and gpu.startswith("/c/venv-") and cpu != gpu
    assert _venv(checkout, "") == cpu  # nvidia-smi with no GPU (a driver without a card)
    assert _venv(checkout, "GPU 0: NVIDIA H200 (UUID: GPU-0)\\n", KERAS_VIT_GPU="0") == cpu
    assert _venv(checkout, KERAS_VIT_GPU="1") == gpu
    assert _venv(checkout, KERAS_VIT_GPU="yes") == (2, "error: KERAS_VIT_GPU must be 0, 1 or auto, got 'yes'")


@pytest.mark.parametrize("path", ["requirements/gpu-lock.txt", "tools/ensure_env.sh"])
def test_the_environment_key_covers(path, checkout):
    """Changing a lock or the script must give another environment, not reuse a stale one."""
    before = _venv(checkout, KERAS_VIT_GPU="1")
    with open(checkout / path, "a") as f:
        f.write("\n# changed\n")
    assert _venv(checkout, KERAS_VIT_GPU="1") != before
