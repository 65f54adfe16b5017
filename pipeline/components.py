"""The pipeline's custom TFX components.

- `ImageExampleGen`: a TFDS dataset, an image folder or TFRecords -> Examples
  (`image`, `label`, `label_name`, `source_id`, `hash`), as a Beam job.
- `CurateSchema`: the inferred schema, tightened to what the model needs: every
  record has one image and one label in [0, C), and label names from the source.
- `ValidationGate`: stops the run before training when ExampleValidator found anomalies.
- `Dedup`: removes training images that copy an eval/test image (Beam), with a report.
- `ServingPusher`: copies a blessed model to `<serving_dir>/<model_name>/<version>/`,
  never the same model twice, and says why when it does not push.
"""

# No `from __future__ import annotations`: TFX reads the component signatures' types.
import hashlib
import json
import os
from typing import Dict, List

import apache_beam as beam
import tensorflow as tf
from tfx.dsl.component.experimental.annotations import (BeamComponentParameter, InputArtifact,
                                                        OutputArtifact, Parameter)
from tfx.dsl.component.experimental.decorators import component
from tfx.types import artifact, artifact_utils, standard_artifacts

from keras_vit import storage
from pipeline import dedup, dedup_beam, ingest, model_card

CLASS_NAMES_FILE = "class_names.json"
PUSH_RECORD = "assets.extra/keras_vit_push.json"  # relative to the version directory


class DedupReport(artifact.Artifact):
    """`report.json` (counts and pairs), `pairs.csv` and `contact_sheet.png`."""

    TYPE_NAME = "keras_vit.DedupReport"  # <namespace>.<Name>, as Kubeflow V2 schema titles need


class DataValidationError(RuntimeError):
    """ExampleValidator found anomalies; the message lists them."""


def split_pattern(examples: artifact.Artifact, split: str) -> str:
    return os.path.join(artifact_utils.get_split_uri([examples], split), "*")


def read_class_names(examples_uri: str) -> List[str]:
    path = os.path.join(examples_uri, CLASS_NAMES_FILE)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path} is missing: these examples were not made by ImageExampleGen")
    with tf.io.gfile.GFile(path) as f:
        return json.load(f)


def _write_split(pcoll, uri, split):
    return (pcoll | f"Serialize[{split}]" >> beam.Map(lambda ex: ex.SerializeToString())
            | f"Write[{split}]" >> beam.io.WriteToTFRecord(
                os.path.join(uri, f"Split-{split}", "data_tfrecord"), file_name_suffix=".gz"))


def _count(pcoll, split):
    def inc(x):
        beam.metrics.Metrics.counter("keras_vit", f"records_{split}").inc()
        return x

    return pcoll | f"Count[{split}]" >> beam.Map(inc)


def _counter(result, name) -> int:
    from apache_beam.metrics.metric import MetricsFilter

    found = result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return int(sum(c.committed for c in found))


def producer_executions(artifacts) -> Dict[str, int]:
    """{component id: execution id} of the executions that wrote `artifacts`, read from the
    output URIs TFX's launcher gives (`<pipeline_root>/<component>/<output key>/<execution
    id>`); an artifact laid out otherwise (Kubeflow's) is left out."""
    found = {}
    for a in artifacts:
        parts = a.uri.rstrip("/").split("/")
        if len(parts) >= 3 and parts[-1].isdigit():
            found[parts[-3]] = int(parts[-1])
    return found


def _set_examples_properties(examples, splits, class_names, counts, source):
    from tfx.components.util import examples_utils
    from tfx.proto import example_gen_pb2

    examples.split_names = artifact_utils.encode_split_names(list(splits))
    examples_utils.set_payload_format(examples, example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE)
    examples_utils.set_file_format(examples, "tfrecords_gzip")
    examples.set_string_custom_property("class_names", json.dumps(class_names))
    examples.set_string_custom_property("split_counts", json.dumps(counts))
    examples.set_string_custom_property("source", source)
    with tf.io.gfile.GFile(os.path.join(examples.uri, CLASS_NAMES_FILE), "w") as f:
        json.dump(class_names, f)


@component(use_beam=True)
def ImageExampleGen(  # noqa: N802  (TFX components are named like classes)
    examples: OutputArtifact[standard_artifacts.Examples],
    source: Parameter[str],
    input_fingerprint: Parameter[str] = "",
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    """Reads `source` (a JSON `ingest.SourceSpec`) into train/eval[/test] Examples.

    `input_fingerprint` only keys the cache: the pipeline sets it from the source
    files, so changed images are read again.
    """
    del input_fingerprint
    spec = ingest.SourceSpec(**json.loads(source))
    p = beam_pipeline
    got = ingest.read_source(p, spec)
    for split, pcoll in got.splits.items():
        _write_split(_count(pcoll, split), examples.uri, split)
    # Beside the examples, on storage the Beam workers share (not this machine's /tmp).
    pairs_dir = os.path.join(examples.uri, ".label_pairs")
    pairs_prefix = os.path.join(pairs_dir, "pairs")
    if got.label_names is not None:
        _ = (got.label_names | "LabelPairsJson" >> beam.Map(json.dumps)
             | "WriteLabelPairs" >> beam.io.WriteToText(pairs_prefix))
    result = p.run()
    result.wait_until_finish()
    class_names = got.class_names
    if class_names is None:
        pairs = []
        for path in tf.io.gfile.glob(pairs_prefix + "*"):
            with tf.io.gfile.GFile(path) as f:
                pairs += [tuple(json.loads(line)) for line in f if line.strip()]
        class_names = ingest.class_names_from_pairs(pairs)
    storage.remove_tree(pairs_dir)
    counts = {split: _counter(result, f"records_{split}") for split in got.splits}
    bad = {split: _counter(result, ingest.bad_records_counter(split)) for split in ingest.SPLITS}
    bad = {split: n for split, n in bad.items() if n}
    _set_examples_properties(examples, got.splits, class_names, counts, spec.describe())
    examples.set_string_custom_property("bad_records_skipped", json.dumps(bad))
    left_out = f", left out bad records {bad}" if bad else ""
    print(f"ImageExampleGen: {spec.describe()} -> {counts}, {len(class_names)} classes{left_out}", flush=True)


@component
def CurateSchema(  # noqa: N802
    schema: InputArtifact[standard_artifacts.Schema],
    examples: InputArtifact[standard_artifacts.Examples],
    curated_schema: OutputArtifact[standard_artifacts.Schema],
) -> None:
    """The inferred schema with the model's contract: one image, one label in [0, C)."""
    from tensorflow_metadata.proto.v0 import schema_pb2
    from tfx.utils import io_utils

    inferred = io_utils.SchemaReader().read(os.path.join(schema.uri, "schema.pbtxt"))
    class_names = read_class_names(examples.uri)
    out = schema_pb2.Schema()
    out.CopyFrom(inferred)
    by_name = {f.name: f for f in out.feature}
    for name, kind in ((ingest.IMAGE, schema_pb2.BYTES), (ingest.LABEL, schema_pb2.INT),
                       (ingest.LABEL_NAME, schema_pb2.BYTES), (ingest.SOURCE_ID, schema_pb2.BYTES),
                       (ingest.HASH, schema_pb2.BYTES)):
        feature = by_name.get(name) or out.feature.add(name=name, type=kind)
        feature.ClearField("shape")
        feature.presence.min_fraction = 1.0
        feature.presence.min_count = 1
        feature.value_count.min = feature.value_count.max = 1
    label = by_name.get(ingest.LABEL) or next(f for f in out.feature if f.name == ingest.LABEL)
    label.ClearField("domain_info")
    label.int_domain.min, label.int_domain.max = 0, len(class_names) - 1
    label.int_domain.is_categorical = True
    label_name = next(f for f in out.feature if f.name == ingest.LABEL_NAME)
    label_name.ClearField("domain_info")
    label_name.ClearField("domain")
    label_name.string_domain.name = ingest.LABEL_NAME
    label_name.string_domain.value[:] = list(class_names)
    io_utils.write_pbtxt_file(os.path.join(curated_schema.uri, "schema.pbtxt"), out)


def anomaly_messages(anomalies_uri: str, split_names: List[str]) -> List[str]:
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    messages = []
    for split in split_names:
        path = os.path.join(anomalies_uri, f"Split-{split}", "SchemaDiff.pb")
        if not tf.io.gfile.exists(path):
            continue
        found = anomalies_pb2.Anomalies.FromString(tf.io.gfile.GFile(path, "rb").read())
        for name, info in sorted(found.anomaly_info.items()):
            messages.append(f"{split}: feature '{name}': {info.short_description}: {info.description}")
        if found.HasField("dataset_anomaly_info"):
            info = found.dataset_anomaly_info
            messages.append(f"{split}: dataset: {info.short_description}: {info.description}")
    return messages


@component
def ValidationGate(  # noqa: N802
    anomalies: InputArtifact[standard_artifacts.ExampleAnomalies],
) -> None:
    """Raises DataValidationError, listing the anomalies, when there are any."""
    splits = artifact_utils.decode_split_names(anomalies.split_names)
    messages = anomaly_messages(anomalies.uri, splits)
    if messages:
        raise DataValidationError(
            "data validation found anomalies; the run stops before training:\n  " + "\n  ".join(messages)
            + f"\n(ExampleValidator output: {anomalies.uri})")
    print(f"ValidationGate: no anomalies in {', '.join(splits)}", flush=True)


def _records_for_dedup(serialized: bytes, prefix: str):
    ex = tf.train.Example.FromString(serialized)
    source_id = ingest.feature_bytes(ex, ingest.SOURCE_ID).decode()
    return (prefix + source_id, ingest.feature_bytes(ex, ingest.IMAGE),
            ingest.feature_bytes(ex, ingest.HASH).decode())


def _keep(serialized: bytes, removed: Dict[str, bool]) -> bool:
    ex = tf.train.Example.FromString(serialized)
    return ingest.feature_bytes(ex, ingest.SOURCE_ID).decode() not in removed


@component(use_beam=True)
def Dedup(  # noqa: N802
    examples: InputArtifact[standard_artifacts.Examples],
    deduplicated_examples: OutputArtifact[standard_artifacts.Examples],
    report: OutputArtifact[DedupReport],
    threshold: Parameter[float] = dedup.DEFAULT_THRESHOLD,
    contact_sheet_pairs: Parameter[int] = 24,
    beam_pipeline: BeamComponentParameter[beam.Pipeline] = None,
) -> None:
    """Drops training images that copy an eval or test image; eval/test pass unchanged."""
    from pipeline import report as report_lib

    splits = artifact_utils.decode_split_names(examples.split_names)
    references = [s for s in splits if s != "train"]
    p = beam_pipeline
    train_raw = p | "ReadTrain" >> beam.io.ReadFromTFRecord(
        split_pattern(examples, "train"), coder=beam.coders.BytesCoder())
    train = train_raw | "TrainRecords" >> beam.Map(_records_for_dedup, "")
    refs = ([p | f"Read[{s}]" >> beam.io.ReadFromTFRecord(split_pattern(examples, s),
                                                          coder=beam.coders.BytesCoder())
             | f"Records[{s}]" >> beam.Map(_records_for_dedup, f"{s}:") for s in references]
            | "AllReferences" >> beam.Flatten())
    pairs = (train, refs) | "FindDuplicates" >> dedup_beam.FindDuplicates(threshold=threshold)
    pairs_prefix = os.path.join(report.uri, "pairs_jsonl")
    _ = pairs | "PairsJson" >> beam.Map(json.dumps) | "WritePairs" >> beam.io.WriteToText(pairs_prefix)
    removed = beam.pvalue.AsDict(pairs | "RemovedIds" >> beam.Map(lambda x: (x[0], True))
                                 | "OnePerId" >> beam.CombinePerKey(lambda v: True))
    kept = _count(train_raw | "Keep" >> beam.Filter(_keep, removed), "train")
    _ = kept | "WriteTrain" >> beam.io.WriteToTFRecord(
        os.path.join(deduplicated_examples.uri, "Split-train", "data_tfrecord"), file_name_suffix=".gz")
    result = p.run()
    result.wait_until_finish()

    for s in references:  # passed through unchanged
        src = artifact_utils.get_split_uri([examples], s)
        dst = os.path.join(deduplicated_examples.uri, f"Split-{s}")
        tf.io.gfile.makedirs(dst)
        for name in tf.io.gfile.listdir(src):
            tf.io.gfile.copy(os.path.join(src, name), os.path.join(dst, name), overwrite=True)
    class_names = read_class_names(examples.uri)
    before = json.loads(examples.get_string_custom_property("split_counts") or "{}")
    _set_examples_properties(deduplicated_examples, splits, class_names,
                             {**before, "train": _counter(result, "records_train")},
                             examples.get_string_custom_property("source"))
    deduplicated_examples.set_string_custom_property("split_counts_before_dedup", json.dumps(before))
    skipped = examples.get_string_custom_property("bad_records_skipped") or "{}"
    deduplicated_examples.set_string_custom_property("bad_records_skipped", skipped)
    deduplicated_examples.set_string_custom_property("made_by", json.dumps(producer_executions([examples])))
    summary = report_lib.write_report(
        report.uri, pairs_prefix, examples_uri=examples.uri, references=references,
        train_count=before.get("train"), threshold=threshold, sheet_pairs=contact_sheet_pairs)
    report.set_string_custom_property("removed", json.dumps(summary["removed_by_split"]))
    report.set_int_custom_property("removed_total", summary["removed_total"])
    print(f"Dedup: removed {summary['removed_total']} training images "
          f"({summary['removed_by_split']}); report in {report.uri}", flush=True)


def _tree_digest(root: str) -> str:
    digest = hashlib.sha256()
    for path, rel in storage.files_under(root):
        if rel == PUSH_RECORD:
            continue
        digest.update(rel.encode() + b"\0")
        with tf.io.gfile.GFile(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()


def pushed_versions(base: str) -> Dict[int, dict]:
    """version -> push record of the versions under a model's serving directory."""
    out = {}
    if storage.isdir(base):
        for name in storage.listdir(base):
            record = storage.join(base, name, *PUSH_RECORD.split("/"))
            if name.isdigit() and storage.exists(record):
                out[int(name)] = json.loads(storage.read_text(record))
    return out


def blessing_reasons(evaluation_uri: str) -> List[str]:
    """The failed thresholds of a TFMA validation, as sentences."""
    import tensorflow_model_analysis as tfma

    try:
        result = tfma.load_validation_result(evaluation_uri)
    except Exception as e:  # noqa: BLE001  (a missing or unreadable result)
        return [f"no validation result in {evaluation_uri} ({e})"]
    reasons = [failure_sentence(f) for per_slice in result.metric_validations_per_slice
               for f in per_slice.failures]
    return reasons or ["the Evaluator did not bless it"]


def failure_sentence(failure) -> str:
    """One TFMA `ValidationFailure` as a sentence: the metric, its value and the threshold.

    TFMA leaves `message` empty for threshold failures, so the sentence is built from
    the value and the threshold it failed.
    """
    from tensorflow_model_analysis.proto import config_pb2

    name = failure.metric_key.name
    if failure.message:
        return f"{name}: {failure.message}"
    value = failure.metric_value.double_value.value
    threshold = failure.metric_threshold
    if failure.metric_key.is_diff and threshold.HasField("change_threshold"):
        change = threshold.change_threshold
        higher = change.direction == config_pb2.MetricDirection.HIGHER_IS_BETTER
        kind = "absolute" if change.HasField("absolute") else "relative"
        limit = getattr(change, kind).value
        return (f"{name} changed by {value:+.4f} against the latest blessed model; the {kind} change "
                f"must be {'at least' if higher else 'at most'} {limit:g}")
    bounds = threshold.value_threshold
    wanted = []
    if bounds.HasField("lower_bound"):
        wanted.append(f">= {bounds.lower_bound.value:g}")
    if bounds.HasField("upper_bound"):
        wanted.append(f"<= {bounds.upper_bound.value:g}")
    return f"{name} is {value:.4f}; it must be {' and '.join(wanted) or 'within its threshold'}"


@component
def ServingPusher(  # noqa: N802
    model: InputArtifact[standard_artifacts.Model],
    model_blessing: InputArtifact[standard_artifacts.ModelBlessing],
    evaluation: InputArtifact[standard_artifacts.ModelEvaluation],
    model_run: InputArtifact[standard_artifacts.ModelRun],
    examples: InputArtifact[standard_artifacts.Examples],
    dedup_report: InputArtifact[DedupReport],
    pushed_model: OutputArtifact[standard_artifacts.PushedModel],
    serving_dir: Parameter[str],
    model_name: Parameter[str],
    code_digest: Parameter[str] = "",
) -> None:
    """Copies a blessed model's SavedModel to `serving_dir/model_name/<next version>/` with
    its model card (`pipeline.model_card`, from `model_run`, `examples`, `dedup_report` and
    `evaluation`), and rewrites models.config and batching_parameters.txt (tuned for the
    new version)."""
    from keras_vit import batching, export

    serving_dir = storage.absolute(serving_dir)
    base = storage.join(serving_dir, model_name)
    src = storage.join(model.uri, "Format-Serving")
    pushed_model.set_int_custom_property("pushed", 0)
    if not model_blessing.get_int_custom_property("blessed"):
        reason = "not blessed: " + "; ".join(blessing_reasons(evaluation.uri))
        pushed_model.set_string_custom_property("reason", reason)
        print(f"ServingPusher: {model.uri} is {reason}; nothing pushed", flush=True)
        return
    digest = _tree_digest(src)
    for version, record in sorted(pushed_versions(base).items()):
        if record.get("digest") == digest:
            where = storage.join(base, str(version))
            reason = f"this model is already served as version {version}"
            pushed_model.set_string_custom_property("reason", reason)
            pushed_model.set_string_custom_property("pushed_destination", where)
            print(f"ServingPusher: {reason} ({where}); nothing pushed", flush=True)
            return
    storage.makedirs(base)
    version = export.next_version(base)
    record = json.dumps({"digest": digest, "model_uri": model.uri})
    card = model_card.build(
        model_name=model_name, version=version,
        blessing="blessed: every threshold of the Evaluator passed",
        source=examples.get_string_custom_property("source"),
        counts_before=json.loads(examples.get_string_custom_property("split_counts_before_dedup") or "{}"),
        counts_after=json.loads(examples.get_string_custom_property("split_counts") or "{}"),
        removed_by_reference=json.loads(dedup_report.get_string_custom_property("removed") or "{}"),
        removed_total=dedup_report.get_int_custom_property("removed_total"),
        trainer=json.loads(storage.read_text(storage.join(model_run.uri, "metrics.json"))),
        evaluation_uri=evaluation.uri, eval_split="eval", class_names=read_class_names(examples.uri),
        code_digest=code_digest,
        bad_records_skipped=json.loads(examples.get_string_custom_property("bad_records_skipped") or "{}"),
        mlmd={"artifacts": {name: a.id for name, a in (
                  ("model", model), ("model_run", model_run), ("evaluation", evaluation),
                  ("blessing", model_blessing), ("examples", examples), ("dedup_report", dedup_report))},
              "executions": {**json.loads(examples.get_string_custom_property("made_by") or "{}"),
                             **producer_executions([examples, model, evaluation, pushed_model])}})

    def write(staging):
        storage.copy_tree(src, staging)
        storage.write_text(storage.join(staging, "model_card.json"), json.dumps(card, indent=2))
        storage.write_text(storage.join(staging, "model_card.md"), model_card.markdown(card))
        storage.write_text(storage.join(staging, *PUSH_RECORD.split("/")), record)

    final = storage.publish(storage.join(base, str(version)), write)
    export.write_models_config(serving_dir)
    batching.tune(final)
    pushed_model.set_int_custom_property("pushed", 1)
    pushed_model.set_string_custom_property("pushed_destination", final)
    pushed_model.set_int_custom_property("pushed_version", version)
    pushed_model.set_string_custom_property("reason", "blessed and new")
    print(f"ServingPusher: pushed {model.uri} to {final}", flush=True)
