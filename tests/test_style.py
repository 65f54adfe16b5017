"""The line rules setup.cfg declares for flake8 hold, without flake8 in the lock.

flake8 is a development tool, not something `make test` installs, so the rules
it would enforce are checked here: they fail CI instead of drifting silently.
"""

import configparser
import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIRECTORIES = ("keras_vit", "pipeline", "benchmarks", "experiments", "tests", "tools")


def max_line_length():
    config = configparser.ConfigParser(interpolation=None)
    config.read(os.path.join(ROOT, "setup.cfg"))
    return config.getint("flake8", "max-line-length")


def python_files():
    files = [f for d in DIRECTORIES for f in glob.glob(os.path.join(ROOT, d, "**", "*.py"), recursive=True)]
    return sorted(os.path.relpath(f, ROOT) for f in files)


def test_python_files_are_found():
    assert {"keras_vit/vit.py", "tests/test_style.py", "tools/make_hf_fixture.py"} <= set(python_files())


@pytest.mark.parametrize("path", python_files())
def test_lines(path):
    limit = max_line_length()
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().split("\n")
    problems = []
    for number, line in enumerate(lines, 1):
        if len(line) > limit:
            problems.append(f"{path}:{number}: {len(line)} characters (setup.cfg allows {limit})")
        if line != line.rstrip():
            problems.append(f"{path}:{number}: trailing whitespace")
        if "\t" in line[:len(line) - len(line.lstrip())]:
            problems.append(f"{path}:{number}: tab in indentation")
    assert not problems, "\n".join(problems)
