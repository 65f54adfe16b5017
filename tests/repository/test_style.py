"""flake8, with the rules in setup.cfg, passes on every Python file we ship or test.

setup.cfg's [flake8] section is what a developer's editor reads, and it says which
folders are left out; running it here makes CI hold the code to the same rules
instead of letting them drift.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def flake8(*paths):
    """flake8's findings as `(line, code)` pairs, and its exit status."""
    run = subprocess.run([sys.executable, "-m", "flake8", *paths], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    findings = [(int(row.split(":")[1]), row.split()[1]) for row in run.stdout.splitlines()]
    return findings, run


def test_flake8_passes():
    findings, run = flake8()  # the whole tree, less setup.cfg's exclude
    assert run.returncode == 0 and not findings, f"flake8 found problems:\n{run.stdout}{run.stderr}"


def test_flake8_applies_setup_cfg(tmp_path):
    # The limit is setup.cfg's 110, not flake8's default 79: a 110-character line
    # passes, a 111-character one fails, and so does an unused import.
    source = tmp_path / "sample.py"
    source.write_text(f"x = '{'a' * 104}'\ny = '{'b' * 105}'\nimport os\n")
    findings, run = flake8(str(source))
    codes = {code for _, code in findings}
    assert run.returncode == 1 and {"E501", "F401"} <= codes, run.stdout + run.stderr
    assert 1 not in {line for line, _ in findings}, run.stdout
