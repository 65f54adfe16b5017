"""The model card the pusher writes beside each pushed version: `model_card.json` and
`model_card.md`, built from the artifacts that made the model.

It holds the data source and split sizes, what Dedup removed per split, the model
config with its parameters and MACs, the training recipe, steps and precision, the
Evaluator's metrics overall and per class, the blessing, the code digest, and the
ML Metadata ids of the artifacts (with the pipeline run), from which MLMD's events
lead to every execution that made them.
"""

from __future__ import annotations

import json
from typing import Dict, List

FILES = ("model_card.json", "model_card.md")


def evaluator_metrics(evaluation_uri: str) -> Dict[str, float]:
    """The candidate model's overall metrics (name -> value) in a TFMA output."""
    import tensorflow_model_analysis as tfma

    out = {}
    for per_slice in tfma.load_metrics(evaluation_uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for kv in per_slice.metric_keys_and_values:
            key = kv.key
            if key.is_diff or (key.model_name and key.model_name != "candidate") or key.HasField("sub_key"):
                continue
            if kv.value.HasField("double_value"):
                out[key.name] = kv.value.double_value.value
    return out


def per_class_accuracy(evaluation_uri: str, class_names: List[str]) -> Dict[str, dict]:
    """class name -> {"accuracy": top-1 recall of the class, "examples": its count},
    from TFMA's multi-class confusion matrix (the argmax prediction) of the candidate."""
    import tensorflow_model_analysis as tfma

    for per_slice in tfma.load_plots(evaluation_uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for kv in per_slice.plot_keys_and_values:
            if kv.key.model_name not in ("", "candidate") or not kv.value.HasField(
                    "multi_class_confusion_matrix_at_thresholds"):
                continue
            matrix = kv.value.multi_class_confusion_matrix_at_thresholds.matrices[0]
            total = [0.0] * len(class_names)
            right = [0.0] * len(class_names)
            for entry in matrix.entries:
                total[entry.actual_class_id] += entry.num_weighted_examples
                if entry.predicted_class_id == entry.actual_class_id:
                    right[entry.actual_class_id] += entry.num_weighted_examples
            return {name: {"accuracy": right[i] / total[i] if total[i] else None, "examples": int(total[i])}
                    for i, name in enumerate(class_names)}
    raise ValueError(f"no multi-class confusion matrix in {evaluation_uri}; the Evaluator's config needs "
                     "MultiClassConfusionMatrixPlot")


def build(*, model_name: str, version: int, blessing: str, source: str, counts_before: Dict[str, int],
          counts_after: Dict[str, int], removed_by_reference: Dict[str, int], removed_total: int,
          trainer: dict,
          evaluation_uri: str, eval_split: str, class_names: List[str], code_digest: str,
          mlmd: Dict[str, Dict[str, int]], bad_records_skipped: Dict[str, int]) -> dict:
    """The card's content. `trainer` is the Trainer's metrics.json (`keras_vit.training.train`);
    `mlmd` holds ML Metadata ids: "artifacts" by input name, "executions" by component."""
    return {
        "model_name": model_name, "version": version, "blessing": blessing,
        "data": {"source": source, "split_counts_before_dedup": counts_before, "split_counts": counts_after,
                 "dedup_removed_by_reference": removed_by_reference,
                 "dedup_removed_total": removed_total,
                 "bad_records_skipped": bad_records_skipped},
        "model": {"name": trainer["model"], "config": trainer["model_config"], "params": trainer["params"],
                  "macs": trainer["macs"]},
        "training": {k: trainer[k] for k in ("recipe", "steps", "batch_size", "precision", "train_seconds")},
        "evaluation": {"split": eval_split, "metrics": evaluator_metrics(evaluation_uri),
                       "per_class": per_class_accuracy(evaluation_uri, class_names)},
        "code_digest": code_digest, "mlmd": mlmd,
    }


def markdown(card: dict) -> str:
    """The card as a page a person reads."""
    data, model, training, ev = card["data"], card["model"], card["training"], card["evaluation"]
    lines = [f"# {card['model_name']} version {card['version']}", "",
             f"Blessing: {card['blessing']}.", "",
             "## Data", "", f"Source: {data['source']}.", "",
             "| split | examples | before Dedup |", "| --- | ---: | ---: |"]
    lines += [f"| {s} | {n:,} | {data['split_counts_before_dedup'].get(s, n):,} |"
              for s, n in data["split_counts"].items()]
    # A training image may copy images of both eval and test: the counts by reference
    # split may add up to more than the total.
    removed = ", ".join(f"{n} copying {s} images" for s, n in data["dedup_removed_by_reference"].items())
    skipped = ", ".join(f"{n} in {s}" for s, n in data["bad_records_skipped"].items())
    lines += ["", f"Left out as undecodable: {skipped or 'none'}.",
              f"Dedup removed {data['dedup_removed_total']} training images ({removed or 'none'}).", "",
              "## Model", "", f"{model['name']}: {model['params']:,} parameters, "
              f"{model['macs'] / 1e6:,.1f} M multiply-adds per image.", "",
              "```json", json.dumps(model["config"], indent=2, sort_keys=True), "```", "",
              "## Training", "", f"{training['steps']} steps of batch {training['batch_size']} in "
              f"{training['precision']}, {training['train_seconds']} s.", "",
              "```json", json.dumps(training["recipe"], indent=2, sort_keys=True), "```", "",
              f"## Evaluation ({ev['split']} split)", "", "| metric | value |", "| --- | ---: |"]
    lines += [f"| {k} | {v:,.0f} |" if k.endswith("count") else f"| {k} | {v:.4f} |"
              for k, v in sorted(ev["metrics"].items())]
    lines += ["", "| class | top-1 accuracy | examples |", "| --- | ---: | ---: |"]
    for name, c in ev["per_class"].items():
        accuracy = "-" if c["accuracy"] is None else format(c["accuracy"], ".4f")
        lines.append(f"| {name} | {accuracy} | {c['examples']} |")
    executions = ", ".join(f"{k} {v}" for k, v in card["mlmd"]["executions"].items())
    lines += ["", "## Provenance", "", f"Code digest: `{card['code_digest']}`.", "",
              f"ML Metadata executions: {executions or 'not known for this orchestrator'}.", "",
              "ML Metadata artifacts: " + ", ".join(f"{k} {v}" for k, v in card["mlmd"]["artifacts"].items())
              + "."]
    return "\n".join(lines) + "\n"
