"""One `vit_throughput` run's every timed call, saved so that several runs can be pooled.

On shared cores a paired ratio moves between runs by more than one run's interval is
wide (RESULTS.md: up to 0.13 between two runs of the same code), so a target near the
ratio is judged over several runs (`benchmarks.pool_runs`), each saved with
`vit_throughput --times_out=run.json`. A record is JSON:

    {"format": "keras-vit-throughput/1", "machine": "AMD EPYC, 2 CPUs, avx512_bf16",
     "mode": "inference", "image_size": 224, "peak": {"float32": 2e11, ...},
     "rows": [{"model": "ViT-Ti/16", "precision": "float32", "batch": 32,
               "flops_per_image": 2.3e9,
               "times": {"ours": {"off": [seconds per round], "on": [...]},
                         "keras-hub": {...}}}]}
"""

from __future__ import annotations

import json
import os
from typing import Dict, List

FORMAT = "keras-vit-throughput/1"
KINDS = ("ours", "keras-hub")


def machine(cpuinfo: str = "/proc/cpuinfo") -> str:
    """What a run's cores were: `"AMD EPYC, 2 CPUs, avx512_bf16"` (the CPU model, the
    CPUs this process may run on, and the bf16 matmul flags it has, or "no bf16")."""
    from keras_vit.training.precision import FAST_BF16_CPU_FLAGS, cpu_flags

    name = "unknown CPU"
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    bf16 = [f for f in FAST_BF16_CPU_FLAGS if f in cpu_flags(cpuinfo)]
    return f"{name}, {len(os.sched_getaffinity(0))} CPUs, {'+'.join(bf16) or 'no bf16'}"


def new_record(mode: str, image_size: int, peak: Dict[str, float]) -> dict:
    return {"format": FORMAT, "machine": machine(), "mode": mode, "image_size": int(image_size),
            "peak": {k: float(v) for k, v in peak.items()}, "rows": []}


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
