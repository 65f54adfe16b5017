"""Issue 6's targets, and judging a side-by-side comparison against them.

`vit_throughput`'s best-of table (each model at its best XLA setting) ends each row with
the precision's target ratio, whether the paired ratio's interval meets it, and the
share of the machine's matmul peak ours would need to run at the target: a target that
needs more than 100% cannot be met on that machine by any faster graph.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from benchmarks import measure

# Issue 6's targets: inference 1.2x keras-hub in float32 and 1.5x in mixed_bfloat16,
# stated at batch 32 (the table judges every batch it times against them); training
# steps at least keras-hub's in both.
ISSUE_TARGETS = {"inference": ["float32=1.2", "mixed_bfloat16=1.5"],
                 "train": ["float32=1", "mixed_bfloat16=1"]}

BEST_HEADER = ("| model | precision | batch | ours img/s | keras-hub img/s | ours / keras-hub (90% interval) "
               "| target | met? | the target needs, % of peak |\n|---|---|---:|---:|---:|---:|---:|---|---:|")


def parse_targets(entries):
    """`["float32=1.2", ...]` -> `{"float32": 1.2, ...}`; ValueError on a malformed entry
    or a precision no model runs in."""
    from keras_vit.training.precision import PRECISIONS

    targets = {}
    for entry in entries:
        precision, _, ratio = entry.partition("=")
        try:
            value = float(ratio)
        except ValueError:
            value = float("nan")
        if precision not in PRECISIONS or precision == "auto" or not value > 0:
            raise ValueError(f"--targets entries are precision=ratio, a precision of {PRECISIONS[1:]} "
                             f"and a ratio above 0, got {entry!r}")
        targets[precision] = value
    return targets


def best_row(name, precision, batch, ours_times, hub_times, flops_per_image, peak_flops, target=None):
    """The best-of table's row from each model's per-round times at its best XLA setting
    (`measure.fastest_per_round`): img/s of the fastest calls, the paired ratio with its
    interval, and, for a `target` ratio, whether it is met and what share of `peak_flops`
    ours would need to run at `target` times keras-hub's fastest call."""
    ours, hub = batch / np.min(ours_times), batch / np.min(hub_times)
    estimate = measure.speedup(hub_times, ours_times)
    judged = "- | - | -"
    if target is not None:
        needs = target * hub * flops_per_image / peak_flops
        judged = f"{target:g}x | {verdict(estimate, target)} | {100 * needs:.0f}%"
    return (f"| {name} | {precision} | {batch} | {ours:.1f} | {hub:.1f} | "
            f"{measure.format_speedup(estimate)} | {judged} |")


POOLED_HEADER = ("| model | precision | batch | runs | each run's ours / keras-hub | pooled (90% interval) "
                 "| target | met? | each run alone |\n|---|---|---:|---:|---|---:|---:|---|---|")


def pooled_row(name, precision, batch, runs, target=None):
    """The pooled table's row from several runs' `(keras-hub, ours)` per-round times
    (`run_record.best_of_pairs`): each run's paired ratio, the pooled ratio with its
    interval over runs and rounds (`measure.pooled_speedup`), and, for a `target`, the
    verdict on the pooled interval and how each run alone would have judged it."""
    each = [measure.speedup(hub, ours) for hub, ours in runs]
    pooled = measure.pooled_speedup(runs)
    judged = "- | - | -"
    if target is not None:
        alone = [verdict(e, target) for e in each]
        counts = ", ".join(f"{alone.count(v)} {v}" for v in ("yes", "at the edge", "no") if v in alone)
        judged = f"{target:g}x | {verdict(pooled, target)} | {counts}"
    medians = ", ".join(f"{e[0]:.3f}" for e in each)
    return (f"| {name} | {precision} | {batch} | {len(runs)} | {medians} | "
            f"{measure.format_speedup(pooled)} | {judged} |")


def verdict(estimate: Tuple[float, float, float], target: float) -> str:
    """Whether a `speedup` estimate meets `target`: "yes" when its whole interval is at
    or above it, "no" when the whole interval is below it, "at the edge" when the
    interval holds it (the runs could not tell the two apart)."""
    _, low, high = estimate
    if low >= target:
        return "yes"
    if high < target:
        return "no"
    return "at the edge"
