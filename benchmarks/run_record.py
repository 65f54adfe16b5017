"""One `vit_throughput` run's every timed call, saved so that several runs can be pooled.

On shared cores a paired ratio moves between runs by more than one run's interval is
wide (RESULTS.md: up to 0.13 between two runs of the same code), so a target near the
ratio is judged over several runs (`benchmarks.pool_runs`), each saved with
`vit_throughput --times_out=run.json`. A record is JSON:

    {"format": "keras-vit-throughput/1", "machine": "AMD EPYC, 2 CPUs, avx512_bf16",
     "started": "2026-12-04T02:40:11Z", "code": "3f9c0a1b2d4e", "commit": "b664298-dirty",
     "mode": "inference", "image_size": 224, "peak": {"float32": 2e11, ...},
     "rows": [{"model": "ViT-Ti/16", "precision": "float32", "batch": 32,
               "flops_per_image": 2.3e9,
               "times": {"ours": {"off": [seconds per round], "on": [...]},
                         "keras-hub": {...}}}]}

`code` is a digest of the `keras_vit` sources the run timed, so runs of different model
code are not pooled by mistake; `commit` is for people (git's, when there is one).
Records written before these three keys were added lack them.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import subprocess
from typing import Dict, List, Optional

FORMAT = "keras-vit-throughput/1"
KINDS = ("ours", "keras-hub")


def machine(cpuinfo: str = "/proc/cpuinfo") -> str:
    """What a run's cores were: `"AMD EPYC, 2 CPUs, avx512_bf16"` (the CPU model, the
    CPUs this process may run on, and the bf16 matmul flags it has, or "no bf16")."""
    from keras_vit.hardware import bf16_instructions, cpu_flags

    name = "unknown CPU"
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    bf16 = bf16_instructions(cpu_flags(cpuinfo))
    return f"{name}, {len(os.sched_getaffinity(0))} CPUs, {'+'.join(bf16) or 'no bf16'}"


def code_digest(package_dir: Optional[str] = None) -> str:
    """12 hex digits of a SHA-256 over the `.py` files under `package_dir` (default: the
    imported `keras_vit`), by relative path and content: the same for the same model
    code, whatever the commit, and different for uncommitted edits."""
    if package_dir is None:
        import keras_vit

        package_dir = os.path.dirname(os.path.abspath(keras_vit.__file__))
    files = sorted(os.path.relpath(os.path.join(d, f), package_dir)
                   for d, _, names in os.walk(package_dir) for f in names if f.endswith(".py"))
    h = hashlib.sha256()
    for rel in files:
        with open(os.path.join(package_dir, rel), "rb") as f:
            h.update(rel.replace(os.sep, "/").encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()[:12]


def git_commit(directory: str) -> Optional[str]:
    """`git describe --always --dirty` in `directory` ("b664298-dirty"), or None outside git."""
    try:
        out = subprocess.run(["git", "-C", directory, "describe", "--always", "--dirty", "--abbrev=7"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def new_record(mode: str, image_size: int, peak: Optional[Dict[str, float]] = None) -> dict:
    """A record with no rows yet, started now; `peak` maps dtype to FLOP/s (`measure.matmul_peak`)."""
    import keras_vit

    package = os.path.dirname(os.path.abspath(keras_vit.__file__))
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"format": FORMAT, "machine": machine(), "started": started, "code": code_digest(package),
            "commit": git_commit(os.path.dirname(package)), "mode": mode, "image_size": int(image_size),
            "peak": {k: float(v) for k, v in (peak or {}).items()}, "rows": []}


def provenance(record: dict) -> str:
    """When and of what code a run was: "started 2026-12-04 02:40 UTC, code 3f9c0a1b2d4e
    (b664298-dirty)", with "not recorded" for what an older record lacks."""
    started = record.get("started")
    when = f"started {started[:10]} {started[11:16]} UTC" if started else "start not recorded"
    code = f"code {record['code']}" if record.get("code") else "code not recorded"
    return f"{when}, {code}" + (f" ({record['commit']})" if record.get("commit") else "")


def add_row(record: dict, model: str, precision: str, batch: int, flops_per_image: float, times) -> None:
    """Appends one model/precision/batch case: `times` maps `(kind, jit)` (jit a bool) to
    `[rounds]` seconds, as `vit_throughput` times them."""
    nested: Dict[str, Dict[str, List[float]]] = {}
    for (kind, jit), seconds in times.items():
        nested.setdefault(kind, {})["on" if jit else "off"] = [float(s) for s in seconds]
    record["rows"].append({"model": model, "precision": precision, "batch": int(batch),
                           "flops_per_image": float(flops_per_image), "times": nested})


def save(record: dict, path: str) -> None:
    """Writes `record` to `path` whole or not at all (an interrupted write leaves the
    last complete version)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        json.dump(record, f)
    os.replace(partial, path)


def load(path: str) -> dict:
    """A saved record; ValueError naming the file when it is not one this version reads."""
    try:
        with open(path) as f:
            record = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON ({e}); pass files written by "
                         f"vit_throughput --times_out") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        found = record.get("format") if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{path} is not a {FORMAT} record (format: {found!r}); pass files written "
                         f"by vit_throughput --times_out")
    for key in ("machine", "mode", "image_size", "peak", "rows"):
        if key not in record:
            raise ValueError(f"{path} has no {key!r}")
    for row in record["rows"]:
        missing = [k for k in ("model", "precision", "batch", "flops_per_image", "times") if k not in row]
        if missing:
            raise ValueError(f"{path}: a row has no {', '.join(missing)}")
        # Every case of a row was timed in the same rounds: pairs need equal lengths.
        rounds = {len(t) for settings in row["times"].values() for t in settings.values()}
        if len(rounds) != 1 or not rounds.pop():
            raise ValueError(f"{path}: {row['model']} {row['precision']} batch {row['batch']}: "
                             f"its cases do not hold the same, non-zero number of rounds")
    return record


def best_of_pairs(records, paths) -> Dict[tuple, list]:
    """`(model, precision, batch)` -> one `(keras-hub, ours)` pair of `[rounds]` times per
    run that timed it, each model at its best XLA setting round by round
    (`measure.fastest_per_round`), in the order the cases were first timed. ValueError
    for a run without keras-hub's times, or one that timed other XLA settings of a case
    than the run before it (its best of them would be another comparison)."""
    from benchmarks import measure

    cases: Dict[tuple, list] = {}
    settings: Dict[tuple, str] = {}
    for record, path in zip(records, paths):
        for row in record["rows"]:
            missing = [kind for kind in KINDS if kind not in row["times"]]
            if missing:
                raise ValueError(f"{path}: {row['model']} has no {' or '.join(missing)} times (a run with "
                                 f"--keras_hub=false); pooling compares ours with keras-hub")
            key = (row["model"], row["precision"], row["batch"])
            timed = "; ".join(f"{kind} XLA {'/'.join(sorted(row['times'][kind]))}" for kind in KINDS)
            if settings.setdefault(key, timed) != timed:
                raise ValueError(f"{path}: {row['model']} {row['precision']} batch {row['batch']} was timed "
                                 f"with {timed}, a run before it with {settings[key]}; "
                                 f"pool runs of the same --jit")
            hub, ours = (measure.fastest_per_round(*row["times"][kind].values())
                         for kind in ("keras-hub", "ours"))
            cases.setdefault(key, []).append((hub, ours))
    return cases
