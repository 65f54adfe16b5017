"""BUILD stays accurate: every module and test belongs to a target, and every import resolves.

Bazel cannot build offline here, so this reads BUILD as the Starlark it is (a
subset of Python) and checks it against the tree.
"""

import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGES = ("keras_vit", "pipeline", "benchmarks", "experiments")


def parse_build():
    targets = {}

    def rule(kind):
        def add(name, srcs=(), deps=(), data=(), **_):
            assert name not in targets, f"target {name} defined twice"
            targets[name] = {"kind": kind, "srcs": list(srcs), "deps": list(deps), "data": list(data)}
        return add

    with open(os.path.join(ROOT, "BUILD")) as f:
        source = f.read()
    source = re.sub(r"^load\(.*\)$", "", source, flags=re.M)
    env = {"py_library": rule("py_library"), "py_test": rule("py_test"), "py_binary": rule("py_binary"),
           "package": lambda **_: None, "requirement": lambda name: f"@pypi//{name}",
           "glob": lambda patterns: [p for pat in patterns for p in glob.glob(os.path.join(ROOT, pat),
                                                                              recursive=True)]}
    exec(compile(source, "BUILD", "exec"), env)
    return targets


TARGETS = parse_build()


def tracked_python_files():
    files = []
    for package in PACKAGES:
        files += glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
    return sorted(os.path.relpath(f, ROOT) for f in files)


def owners(path):
    """The library or test a file belongs to; a script only a py_binary lists belongs to that."""
    found = [n for n, t in TARGETS.items() if path in t["srcs"] and t["kind"] != "py_binary"]
    return found or [n for n, t in TARGETS.items() if path in t["srcs"]]


def test_every_source_file_exists():
    for name, target in TARGETS.items():
        for src in target["srcs"]:
            assert os.path.exists(os.path.join(ROOT, src)), f"{name} lists missing file {src}"


@pytest.mark.parametrize("path", tracked_python_files())
def test_every_python_file_belongs_to_exactly_one_target(path):
    assert len(owners(path)) == 1, f"{path} belongs to {owners(path) or 'no target'}"


@pytest.mark.parametrize("path", [p for p in tracked_python_files()
                                  if os.path.basename(p).startswith("test_")])
def test_every_test_file_is_a_py_test(path):
    (owner,) = owners(path)
    assert TARGETS[owner]["kind"] == "py_test" and TARGETS[owner]["srcs"] == [path]


def test_deps_name_real_targets_and_locked_packages():
    with open(os.path.join(ROOT, "requirements", "lock.txt")) as f:
        locked = {m.group(1).lower() for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==", f.read(), re.M)}
    for name, target in TARGETS.items():
        for dep in target["deps"]:
            if dep.startswith(":"):
                assert dep[1:] in TARGETS, f"{name} depends on unknown target {dep}"
            else:
                assert dep.split("//")[1].lower() in locked, f"{name}: {dep} is not in the lock"


def closure(name, seen=None):
    seen = set() if seen is None else seen
    if name not in seen:
        seen.add(name)
        for dep in TARGETS[name]["deps"]:
            if dep.startswith(":"):
                closure(dep[1:], seen)
    return seen


def module_owner(module):
    parts = module.split(".")
    for candidate in (os.path.join(*parts) + ".py", os.path.join(*parts, "__init__.py")):
        found = owners(candidate)
        if found:
            return found[0]
    return None


@pytest.mark.parametrize("path", tracked_python_files())
def test_imports_of_our_modules_are_reachable_through_deps(path):
    (owner,) = owners(path)
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules |= {f"{node.module}.{a.name}" for a in node.names}
    reachable = closure(owner)
    for module in sorted(modules):
        if module.split(".")[0] not in PACKAGES + ("conftest",):
            continue
        parts = module.split(".")
        # Importing a.b.c runs a/__init__.py and a/b/__init__.py too.
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth])
            target = module_owner(prefix) if prefix != "conftest" else "test_support"
            if target is None:
                continue  # a name imported from a module, not a module
            assert target in reachable, (f"{path} imports {prefix} ({target}) "
                                         f"but {owner} does not depend on it")


def test_every_command_line_tool_is_a_console_script():
    import ast
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    scripts = dict(line.split(" = ") for line in config["options.entry_points"]["console_scripts"].split("\n")
                   if line.strip())
    verbs = ("train", "evaluate", "export", "predict", "visualize", "zoo", "batching")
    assert {f"keras-vit-{v}" for v in verbs} <= set(scripts), sorted(scripts)
    for name, target in scripts.items():  # read, not imported: some CLIs define absl flags on import
        module, _, function = target.partition(":")
        tree = ast.parse(open(os.path.join(ROOT, *module.split(".")) + ".py").read())
        assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, name
