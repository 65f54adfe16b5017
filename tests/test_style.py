"""flake8, with the rules in setup.cfg, passes on every Python file we ship or test.

setup.cfg's [flake8] section is what a developer's editor reads; running it here
makes CI hold the code to the same rules instead of letting them drift.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRECTORIES = ("keras_vit", "pipeline", "benchmarks", "experiments", "tests", "tools")


def flake8(*paths, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "flake8", *paths], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_flake8_passes():
    run = flake8(*DIRECTORIES)
    assert run.returncode == 0, f"flake8 found problems:\n{run.stdout}{run.stderr}"


def test_flake8_applies_setup_cfg(tmp_path):
    # The limit is setup.cfg's 110, not flake8's default 79: a 110-character line
    # passes, a 111-character one fails, and so does an unused import.
    source = tmp_path / "sample.py"
    source.write_text(f"x = '{'a' * 104}'\ny = '{'b' * 105}'\nimport os\n")
    run = flake8(str(source))
    codes = sorted(line.split(": ")[1].split()[0] for line in run.stdout.splitlines())
    lines = sorted(int(line.split(":")[1]) for line in run.stdout.splitlines())
    assert run.returncode == 1 and "E501" in codes and "F401" in codes, run.stdout + run.stderr
    assert 1 not in lines, run.stdout
