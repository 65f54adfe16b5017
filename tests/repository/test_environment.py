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


@pytest.mark.parametrize("lock", ["requirements/lock.txt", "requirements/current-lock.txt"])
def test_both_locks_lie_inside_the_packages_requirements(lock):
    """setup.cfg's ranges are what users install from: each stack `make test` runs must
    be one of the installs they allow, or the tests prove nothing about them."""
    import configparser

    from packaging.requirements import Requirement

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    pins = {name.lower().replace("_", "-"): version for name, version in _pins(lock).items()}
    checked = 0
    for line in cfg["options"]["install_requires"].split("\n"):
        if not line.strip():
            continue
        requirement = Requirement(line)
        name = requirement.name.lower().replace("_", "-")
        assert name in pins, f"{lock} does not hold {name}, which the package requires"
        assert requirement.specifier.contains(pins[name]), f"{lock}: {name}=={pins[name]} is outside {line}"
        checked += 1
    assert checked >= 6
    python = "3.10" if lock == "requirements/lock.txt" else "3.12"
    from packaging.specifiers import SpecifierSet

    assert SpecifierSet(cfg["options"]["python_requires"]).contains(python)


def test_make_test_runs_both_stacks():
    # The plan of a plain `make test`, even when this suite runs under `make test STACKS=pinned`
    # (make hands its command-line variables down through MAKEFLAGS).
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "STACKS")}
    plan = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env=env)
    assert plan.returncode == 0, plan.stderr
    assert "tools/ensure_env.sh --current" in plan.stdout
    assert ".venv/bin/python -m pytest" in plan.stdout and ".venv-current/bin/python -m pytest" in plan.stdout
    refused = subprocess.run(["make", "-n", "test", "STACKS=newest"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env=env)
    assert refused.returncode != 0 and "STACKS takes pinned and/or current" in refused.stderr


def _current_venv(checkout, gpu):
    run = subprocess.run(["bash", str(checkout / "tools/ensure_env.sh"), "--current", "--print-venv"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "KERAS_VIT_VENV_CACHE": "/c", "KERAS_VIT_GPU": gpu})
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_current_stack_gets_its_own_environment(checkout):
    pinned, current = _venv(checkout, KERAS_VIT_GPU="0"), _current_venv(checkout, "0")
    assert current.startswith("/c/venv-current-") and pinned.startswith("/c/venv-") and current != pinned
    assert _current_venv(checkout, "1") == current  # the CUDA pins are TensorFlow 2.16's
    with open(checkout / "requirements/current-lock.txt", "a") as f:
        f.write("\n# changed\n")
    assert _current_venv(checkout, "0") != current
    assert _venv(checkout, KERAS_VIT_GPU="0") == pinned  # its key ignores the current lock
