"""Pools several `vit_throughput` runs into one verdict per target.

    make bench BENCH_ARGS="--batch_sizes=32 --times_out=runs/bench/1.json"   # two or three times
    make bench BENCH=pool_runs BENCH_ARGS="runs/bench/*.json"

On shared cores a paired ratio moves between runs by more than one run's interval is
wide, so a target near the ratio is judged over runs taken apart (separate processes,
best at different hours). For each model, precision and batch it prints each run's
ratio of the two models at their best XLA settings (as `vit_throughput`'s last table),
the pooled ratio with an interval over runs and rounds (`measure.pooled_speedup`), the
verdict on that interval against the target (`--targets`, by default the issue's for
the runs' mode), and how each run alone judged it. The runs must come from one
machine, mode and resolution, and time one version of the model code (the records'
`code` digests; older records without one are not checked). Figures, never assertions.
"""

from __future__ import annotations

import os

from absl import app, flags

from benchmarks import run_record, targets

FLAGS = flags.FLAGS
flags.DEFINE_list("targets", [],
                  "precision=ratio to judge the pooled ratio against (default: the issue's for the runs' "
                  "mode, benchmarks.targets.ISSUE_TARGETS).")


def main(argv):
    paths = argv[1:]
    if not paths:
        raise app.UsageError("pass the records to pool: "
                             "python -m benchmarks.pool_runs run1.json run2.json ...")
    if len({os.path.realpath(p) for p in paths}) < len(paths):
        raise app.UsageError("a record is passed twice: each run would count twice")
    records = []
    for path in paths:
        if not os.path.isfile(path):
            raise app.UsageError(f"no such file: {path}")
        try:
            records.append(run_record.load(path))
        except ValueError as e:
            raise app.UsageError(str(e))
        if not records[-1]["rows"]:
            raise app.UsageError(f"{path} holds no timed case: its run stopped before the first ended")
    for key in ("machine", "mode", "image_size"):
        found = {str(r[key]) for r in records}
        if len(found) > 1:
            raise app.UsageError(f"the runs differ in {key} ({'; '.join(sorted(found))}): "
                                 f"pool runs of one {key} only")
    codes = {r["code"] for r in records if r.get("code")}
    if len(codes) > 1:
        raise app.UsageError(f"the runs timed different keras_vit code ({', '.join(sorted(codes))}): "
                             f"pool runs of one version of the model only")
    mode = records[0]["mode"]
    try:
        target_ratios = targets.parse_targets(FLAGS.targets or targets.ISSUE_TARGETS[mode])
        cases = run_record.best_of_pairs(records, paths)
    except ValueError as e:
        raise app.UsageError(str(e))
    print(f"{len(records)} runs of {mode} at {records[0]['image_size']} px on {records[0]['machine']}:")
    for i, (path, record) in enumerate(zip(paths, records), 1):
        print(f"  run {i}: {path} ({run_record.provenance(record)})")
    print(targets.POOLED_HEADER)
    for (name, precision, batch), runs in cases.items():
        print(targets.pooled_row(name, precision, batch, runs, target_ratios.get(precision)))


if __name__ == "__main__":
    app.run(main)
