"""Runs the pipeline: `python -m pipeline.run` (LocalDagRunner, SQLite ML Metadata).

    python -m pipeline.run                                  # Fashion-MNIST, about 15 min on 2 cores
    python -m pipeline.run --image_dir=photos/ --model=ViT-S/16 --image_size=224 ...
    python -m pipeline.run --orchestrator=kubeflow_v2 --kubeflow_output=vit_pipeline.json

The last line printed is one JSON object: `pushed`, `serving_model_path`,
`accuracy`, `dedup` (training images removed per reference split), `pipeline_root`.

Beam runs on its FnApiRunner here, in memory or, with `--beam_direct_workers=N`
(N > 1), in N processes. For a cluster, pass runner flags through
`--beam_pipeline_args`, e.g.
  Flink:    --runner=FlinkRunner --flink_master=host:8081 --environment_type=LOOPBACK
  Spark:    --runner=SparkRunner --spark_master_url=spark://host:7077
  Dataflow: --runner=DataflowRunner --project=P --region=R --temp_location=gs://B/tmp
and put `--pipeline_root` and `--serving_dir` on storage the workers share.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
import warnings
from typing import List, Optional

# google-api-core warns on every import under Python 3.10, which TFX 1.16 needs.
warnings.filterwarnings("ignore", message="You are using a non-supported Python version")

from keras_vit import data, storage  # noqa: E402
from pipeline import ingest  # noqa: E402

COMPONENT_ORDER = ("ImageExampleGen", "StatisticsGen", "SchemaGen", "CurateSchema", "ExampleValidator",
                   "ValidationGate", "Dedup", "Trainer", "latest_blessed_model_resolver", "Evaluator",
                   "ServingPusher")


def beam_args(direct_workers: int, extra: Optional[List[str]] = None, env=None,
              s3: bool = False) -> List[str]:
    """Beam flags: the FnApiRunner with `direct_workers` processes (1: in memory), then
    `extra`, whose `--runner` wins. The runner is named: Beam's DirectRunner would first
    try to download and start its Prism runner, so that machines with and without
    internet would run the components differently.

    Where `env` (default os.environ) sets the S3 endpoint or region (`AWS_ENDPOINT_URL`,
    `AWS_REGION`), Beam's S3 filesystem is given them too; its credentials come from
    the AWS variables, never the command line, which TFX records. With `s3` (the
    pipeline's data is on s3://) each worker first imports `pipeline.beam_worker`, which
    gives the TensorFlow code there s3:// too."""
    if direct_workers < 1:
        raise ValueError(f"beam_direct_workers must be >= 1, got {direct_workers}")
    env = os.environ if env is None else env
    args = (["--direct_running_mode=multi_processing", f"--direct_num_workers={direct_workers}"]
            if direct_workers > 1 else ["--direct_running_mode=in_memory", "--direct_num_workers=1"])
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    args += [f"--s3_endpoint_url={endpoint}"] if endpoint else []
    args += [f"--s3_region_name={region}"] if region else []
    args += ["--beam_plugin=pipeline.beam_worker"] if s3 else []
    return ["--runner=FnApiRunner"] + args + list(extra or [])


def input_fingerprint(spec: ingest.SourceSpec) -> str:
    """Changes when the source's files change, so ImageExampleGen's cache is not stale."""
    import tensorflow as tf

    from keras_vit import storage

    digest = hashlib.sha256()
    if spec.image_dir:
        for path, rel in storage.files_under(spec.image_dir):
            st = tf.io.gfile.stat(path)
            digest.update(f"{rel}:{st.length}:{st.mtime_nsec}\n".encode())
    elif spec.tfrecords:
        for split, pattern in sorted(spec.tfrecords.items()):
            for path in storage.glob(pattern):
                st = tf.io.gfile.stat(path)
                digest.update(f"{split}:{path}:{st.length}:{st.mtime_nsec}\n".encode())
    else:
        builder = data.tfds().builder(spec.dataset, data_dir=spec.data_dir)
        digest.update(f"{builder.info.full_name}:{spec.data_dir}".encode())
    return digest.hexdigest()[:24]


class _Progress(logging.Handler):
    """Prints one line per component from the runner's log records."""

    def __init__(self, total: int):
        super().__init__(logging.INFO)
        self.total, self.started, self.done = total, {}, 0

    def emit(self, record):
        msg, args = record.msg, record.args or ()
        if msg == "Component %s is running.":
            self.started[args[0]] = time.time()
            print(f"[{self.done + 1}/{self.total}] {args[0]} ...", file=sys.stderr, flush=True)
        elif msg == "Component %s is finished.":
            self.done += 1
            took = time.time() - self.started.get(args[0], time.time())
            print(f"[{self.done}/{self.total}] {args[0]} done in {took:.0f} s", file=sys.stderr, flush=True)
        elif msg == "A cached execution %d is used.":
            print(f"    (cached: execution {args[0]})", file=sys.stderr, flush=True)


_PREDICATE_WARNING = "ArtifactQuery.property_predicate is not supported."


def _drop_predicate_warning(record) -> bool:
    return record.msg != _PREDICATE_WARNING


_EMPTY_DIR_WARNINGS = ("execution_info.tmp_dir %s is not found", "stateful_working_dir %s is not found")


def _drop_empty_dir_warnings_in_buckets(record) -> bool:
    # TFX removes each execution's scratch directories and warns, with the whole
    # execution proto, when one is not there. In a bucket a directory exists only while
    # it holds a file, so an empty one never is: that is no news.
    return not (isinstance(record.msg, str) and record.msg.startswith(_EMPTY_DIR_WARNINGS)
                and record.args and "://" in str(record.args[0]))


def uses_property_predicates(ir) -> bool:
    """Whether any input channel of a compiled pipeline (`pipeline_pb2.Pipeline`) filters by property."""
    return any(channel.artifact_query.HasField("property_predicate")
               for node in ir.nodes for spec in node.pipeline_node.inputs.inputs.values()
               for channel in spec.channels)


def _run_local(pipeline) -> None:
    from tfx import v1 as tfx
    from tfx.dsl.compiler import compiler

    logger = logging.getLogger("absl")
    handler = _Progress(len(pipeline.components))
    _quiet_absl()
    data.tf_logs_through_absl_only()
    logger.setLevel(logging.INFO)  # INFO reaches the progress handler, not the console
    logger.addHandler(handler)
    # TFX 1.16's channel resolver tests the `property_predicate` message for truth, which
    # a protobuf message always has, so it warns for every input of every component.
    # Only a pipeline that sets one is told it is ignored.
    quiet = not uses_property_predicates(compiler.Compiler().compile(pipeline))
    if quiet:
        logger.addFilter(_drop_predicate_warning)
    logger.addFilter(_drop_empty_dir_warnings_in_buckets)
    try:
        tfx.orchestration.LocalDagRunner().run(pipeline)
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(_drop_empty_dir_warnings_in_buckets)
        if quiet:
            logger.removeFilter(_drop_predicate_warning)


def _quiet_absl():
    from absl import logging as absl_logging

    absl_logging.get_absl_handler().setLevel(logging.WARNING)


def summarise_run(metadata, where: str, pipeline_root: str, pipeline_name: str) -> dict:
    """What the latest run of `pipeline_name` did, from ML Metadata (`metadata`, a
    ConnectionConfig; `where` names it in errors)."""
    import tensorflow_model_analysis as tfma
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    store = metadata_store.MetadataStore(metadata)
    pipeline_ctx = store.get_context_by_type_and_name("pipeline", pipeline_name)
    runs = {}
    if pipeline_ctx is not None:  # a store may hold several pipelines: only this one's runs
        for execution in store.get_executions_by_context(pipeline_ctx.id):
            for ctx in store.get_contexts_by_execution(execution.id):
                if ctx.type == "pipeline_run":
                    runs[ctx.id] = ctx
    runs = list(runs.values())
    if not runs:
        raise RuntimeError(f"no run of pipeline {pipeline_name} in {where}")
    run = max(runs, key=lambda c: (c.create_time_since_epoch, c.id))
    nodes = {}
    for execution in store.get_executions_by_context(run.id):
        node = [c.name.split(".", 1)[-1] for c in store.get_contexts_by_execution(execution.id)
                if c.type == "node"]
        outputs = {}
        events = [e for e in store.get_events_by_execution_ids([execution.id])
                  if e.type in (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)]
        for event, art in zip(events, store.get_artifacts_by_id([e.artifact_id for e in events])):
            key = event.path.steps[0].key if event.path.steps else ""
            outputs[key] = art
        nodes[node[0] if node else execution.name] = (execution, outputs)

    def prop(art, name):
        v = art.custom_properties.get(name)
        return None if v is None else (v.string_value or v.int_value)

    summary = {"pushed": False, "serving_model_path": None, "accuracy": None, "dedup": None,
               "pipeline_root": storage.absolute(pipeline_root), "run_id": run.name}
    states = {name: metadata_store_pb2.Execution.State.Name(e.last_known_state)
              for name, (e, _) in nodes.items()}
    summary["executions"] = {n: states[n] for n in COMPONENT_ORDER if n in states}
    if "Dedup" in nodes and "report" in nodes["Dedup"][1]:
        summary["dedup"] = json.loads(prop(nodes["Dedup"][1]["report"], "removed") or "null")
    if "Evaluator" in nodes and "evaluation" in nodes["Evaluator"][1]:
        uri = nodes["Evaluator"][1]["evaluation"].uri
        for metrics in tfma.load_metrics(uri):
            if metrics.slice_key.single_slice_keys:
                continue
            for kv in metrics.metric_keys_and_values:
                if (kv.key.name == "sparse_categorical_accuracy" and not kv.key.is_diff
                        and kv.key.model_name in ("", "candidate")):
                    summary["accuracy"] = round(kv.value.double_value.value, 6)
    if "ServingPusher" in nodes and "pushed_model" in nodes["ServingPusher"][1]:
        execution, outputs = nodes["ServingPusher"]
        pushed = outputs["pushed_model"]
        if execution.last_known_state == metadata_store_pb2.Execution.CACHED:
            summary["reason"] = "the pusher's inputs are unchanged since the run that pushed or refused it"
        else:
            summary["pushed"] = bool(prop(pushed, "pushed"))
            summary["reason"] = prop(pushed, "reason")
        summary["serving_model_path"] = prop(pushed, "pushed_destination")
    return summary


def compile_kubeflow_v2(pipeline, output: str, image: str) -> str:
    """Writes the Kubeflow V2 (Vertex AI Pipelines) job spec of `pipeline` as JSON."""
    from tfx import v1 as tfx

    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(default_image=image),
        output_dir=os.path.dirname(os.path.abspath(output)), output_filename=os.path.basename(output))
    runner.run(pipeline, write_out=True)
    return output


def _define_flags():
    from absl import flags

    from keras_vit.cli import register_json_object_flag
    from keras_vit.precision import PRECISIONS
    from keras_vit.training import STRATEGIES

    from pipeline import dedup

    flags.DEFINE_string("dataset", "fashion_mnist_local", "TFDS name (with optional /config).")
    flags.DEFINE_string("data_dir", None, "TFDS data directory.")
    flags.DEFINE_string("image_dir", None, "A split/label/image folder tree; replaces --dataset.")
    flags.DEFINE_list("tfrecords", None, "split=pattern pairs of tf.Example TFRecords (image, label); "
                      "replaces --dataset.")
    flags.register_validator("tfrecords", lambda items: all("=" in item for item in items or ()),
                             "wants split=pattern pairs, e.g. train=data/train-*.tfrecord")
    flags.DEFINE_list("class_names", None, "Class names for --tfrecords (default: from the data).")
    flags.DEFINE_float("eval_percent", 10.0,
                       "Percent of train held out as eval when the source has no eval split.")
    flags.DEFINE_boolean("skip_bad_records", False,
                         "Leave out and count images that do not decode (not an image, over the pixel "
                         "bound, cut short or corrupt); without it the first one stops the run, named.")
    flags.DEFINE_string("model", "FMNIST-ViT", "A keras_vit model name.")
    flags.DEFINE_string("model_overrides", "{}", "JSON of ViTConfig overrides.")
    register_json_object_flag("model_overrides")
    flags.DEFINE_integer("image_size", 28, "Model input size.")
    flags.DEFINE_integer("train_steps", 800, "Optimizer updates.")
    flags.DEFINE_integer("batch_size", 256, "Global batch size.")
    flags.DEFINE_float("learning_rate", 3e-3, "Peak learning rate.")
    flags.DEFINE_float("weight_decay", 0.05, "Decoupled weight decay.")
    flags.DEFINE_integer("warmup_steps", 200, "Linear warmup steps.")
    flags.DEFINE_float("dropout_rate", 0.0, "Dropout.")
    flags.DEFINE_float("crop_area_min", 1.0, "Smallest Inception-crop area (1.0: flips only).")
    flags.DEFINE_enum("recipe", "pretrain", ["pretrain", "finetune"], "keras_vit training recipe.")
    flags.DEFINE_string("weights", None, "Checkpoint to start from (with --recipe=finetune): a path, or "
                        "pretrained weights by name or tag (python -m keras_vit.zoo --pretrained).")
    flags.DEFINE_enum("precision", "auto", list(PRECISIONS),
                      "Dtype policy; auto picks bf16 on bf16 hardware.")
    flags.DEFINE_enum("serving_precision", None, list(PRECISIONS),
                      "Dtype policy the pushed SavedModel computes in; default --precision's. bf16 is fast "
                      "only on AMX/AVX512-BF16 CPUs and recent GPUs: for a bf16-trained model served on "
                      "other CPUs, pass float32. auto means the Trainer's machine.")
    flags.DEFINE_enum("strategy", "auto", list(STRATEGIES), "tf.distribute strategy for the Trainer.")
    flags.DEFINE_string("pipeline_name", "keras-vit",
                        "Pipeline name ([a-z0-9][a-z0-9-]*, as Kubeflow needs).")
    flags.register_validator("pipeline_name", lambda name: bool(re.fullmatch(r"[a-z0-9][a-z0-9-]*", name)),
                             "must match [a-z0-9][a-z0-9-]* (Kubeflow's rule)")
    flags.DEFINE_string("pipeline_root", "runs/pipeline",
                        "Where artifacts go: a local directory or a URL tf.io.gfile reads (gs://, s3://).")
    flags.DEFINE_string("metadata_path", None,
                        "Local SQLite ML Metadata file (default <pipeline_root>/metadata.sqlite for a local "
                        "root, runs/metadata/<pipeline_name>.sqlite for a root in a bucket, where SQLite "
                        "cannot live).")
    flags.DEFINE_string("metadata_mysql", None,
                        "ML Metadata in MySQL instead, as user@host[:port]/database; the password is read "
                        "from MYSQL_PWD.")
    flags.DEFINE_string("serving_dir", "saved_models",
                        "Pushed models go to <serving_dir>/<model_name>/<version>/ (local or a URL).")
    flags.DEFINE_string("model_name", "vit", "Serving model name.")
    flags.DEFINE_integer("beam_direct_workers", 1, "DirectRunner processes (1: in memory).", lower_bound=1)
    flags.DEFINE_list("beam_pipeline_args", [], "More Beam flags (Flink, Spark, Dataflow).")
    flags.DEFINE_float("beam_worker_timeout", 600,
                       "Seconds a runner other than the local one has to run a one-element job before "
                       "any component (its workers start and import the pipeline).", lower_bound=1)
    flags.DEFINE_float("dedup_threshold", dedup.DEFAULT_THRESHOLD, "Near-duplicate correlation threshold.",
                       lower_bound=0.0, upper_bound=1.0)
    flags.DEFINE_float("accuracy_threshold", 0.8, "Top-1 on eval a model needs to be blessed.",
                       lower_bound=0.0, upper_bound=1.0)
    flags.DEFINE_boolean("enable_cache", True, "Reuse cached component results.")
    # Not `--runner`: TFX parses the Beam args with absl, where Beam's --runner would meet it.
    flags.DEFINE_enum("orchestrator", "local", ["local", "kubeflow_v2"],
                      "local runs the pipeline here; kubeflow_v2 compiles a JSON spec.")
    flags.DEFINE_string("kubeflow_output", "keras_vit_pipeline.json",
                        "Where --orchestrator=kubeflow_v2 writes.")
    flags.DEFINE_string("kubeflow_image", "keras-vit:latest", "Container image for the Kubeflow V2 spec.")


def build_from_flags(FLAGS):
    """The pipeline, its source and its metadata path; ConfigError for flags that cannot work."""
    from keras_vit.training import ConfigError
    from pipeline import definition

    tfrecords = dict(item.split("=", 1) for item in FLAGS.tfrecords) if FLAGS.tfrecords else None
    given = FLAGS.image_dir or tfrecords
    try:
        spec = ingest.SourceSpec(dataset=None if given else FLAGS.dataset, data_dir=FLAGS.data_dir,
                                 image_dir=FLAGS.image_dir, tfrecords=tfrecords,
                                 class_names=FLAGS.class_names, eval_percent=FLAGS.eval_percent,
                                 skip_bad_records=FLAGS.skip_bad_records)
    except ValueError as e:
        raise ConfigError(f"bad data flags:\n  {e}") from e
    train_config = {
        "model": FLAGS.model, "model_overrides": json.loads(FLAGS.model_overrides or "{}"),
        "image_size": FLAGS.image_size, "batch_size": FLAGS.batch_size, "learning_rate": FLAGS.learning_rate,
        "weight_decay": FLAGS.weight_decay, "warmup_steps": FLAGS.warmup_steps,
        "dropout_rate": FLAGS.dropout_rate,
        "crop_area_min": FLAGS.crop_area_min, "recipe": FLAGS.recipe, "weights": FLAGS.weights,
        "precision": FLAGS.precision, "strategy": FLAGS.strategy, "cache": True,
    }
    local = FLAGS.orchestrator == "local"
    metadata, where = metadata_connection(FLAGS) if local else (None, "the orchestrator's store")
    pipeline = definition.create_pipeline(
        pipeline_name=FLAGS.pipeline_name, pipeline_root=storage.absolute(FLAGS.pipeline_root), source=spec,
        input_fingerprint=input_fingerprint(spec), train_config=train_config, train_steps=FLAGS.train_steps,
        serving_dir=storage.absolute(FLAGS.serving_dir) if local else FLAGS.serving_dir,
        model_name=FLAGS.model_name, dedup_threshold=FLAGS.dedup_threshold,
        accuracy_threshold=FLAGS.accuracy_threshold, metadata_config=metadata,
        beam_pipeline_args=beam_args_from_flags(FLAGS),
        enable_cache=FLAGS.enable_cache, serving_precision=FLAGS.serving_precision)
    return pipeline, spec, (metadata, where)


def user_paths(FLAGS) -> List[str]:
    """The storage locations the flags name: roots, data folders, and the folders of
    the TFRecord patterns."""
    paths = [getattr(FLAGS, f) for f in ("pipeline_root", "serving_dir", "image_dir", "data_dir")]
    for item in FLAGS.tfrecords or ():
        paths.append(storage.parent(item.split("=", 1)[-1]))
    return [p for p in paths if p]


def beam_args_from_flags(FLAGS) -> List[str]:
    s3 = any(path.startswith("s3://") for path in user_paths(FLAGS))
    return beam_args(FLAGS.beam_direct_workers, FLAGS.beam_pipeline_args, s3=s3)


def metadata_connection(FLAGS):
    """(ML Metadata ConnectionConfig, where it is, in words) from the flags: SQLite on
    local disk, or MySQL (`--metadata_mysql`, password from MYSQL_PWD)."""
    from ml_metadata.proto import metadata_store_pb2
    from tfx import v1 as tfx

    from keras_vit.training import ConfigError

    if FLAGS.metadata_mysql:
        if FLAGS.metadata_path:
            raise ConfigError("give --metadata_path (SQLite) or --metadata_mysql, not both")
        found = re.fullmatch(r"([^@/]+)@([^:/]+)(?::(\d+))?/(\w+)", FLAGS.metadata_mysql)
        if not found:
            raise ConfigError(f"--metadata_mysql must look like user@host[:port]/database, "
                              f"got {FLAGS.metadata_mysql!r}")
        user, host, port, database = found.groups()
        config = tfx.orchestration.metadata.mysql_metadata_connection_config(
            host=host, port=int(port or 3306), database=database, username=user,
            password=os.environ.get("MYSQL_PWD", ""))
        return config, f"MySQL {user}@{host}:{port or 3306}/{database}"
    path = FLAGS.metadata_path
    if path is None:
        in_bucket = storage.is_url(FLAGS.pipeline_root)
        path = (os.path.join("runs", "metadata", f"{FLAGS.pipeline_name}.sqlite") if in_bucket
                else os.path.join(FLAGS.pipeline_root, "metadata.sqlite"))
    if storage.is_url(path):
        raise ConfigError(f"--metadata_path={path}: SQLite needs a local file (a bucket has no file locks); "
                          "for a store several machines share, use --metadata_mysql")
    # Not TFX's sqlite_metadata_connection_config, which makes the directory at once:
    # a run whose flags are refused must leave nothing behind.
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = os.path.abspath(path)
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    return config, path


def main(argv):
    from absl import flags

    del argv
    from keras_vit.cli import exit_for_bad_config
    from keras_vit.training import ConfigError
    from pipeline import beam_check

    FLAGS = flags.FLAGS
    _quiet_absl()
    try:
        if FLAGS.orchestrator == "local":  # before anything reads them (the source's fingerprint)
            for path in user_paths(FLAGS):
                storage.check(path)
        pipeline, spec, (metadata, where) = build_from_flags(FLAGS)
    except (ConfigError, storage.StorageError) as e:
        exit_for_bad_config(str(e))
    if FLAGS.orchestrator == "kubeflow_v2":
        out = compile_kubeflow_v2(pipeline, FLAGS.kubeflow_output, FLAGS.kubeflow_image)
        print(f"Wrote the Kubeflow V2 pipeline spec to {out}")
        return
    args = beam_args_from_flags(FLAGS)
    if beam_check.needs_check(args):
        print(f"Checking that the Beam workers start (at most {FLAGS.beam_worker_timeout:g} s) ...",
              file=sys.stderr, flush=True)
        try:
            beam_check.check_workers(args, FLAGS.beam_worker_timeout)
        except beam_check.BeamWorkersError as e:
            sys.exit(f"Stopped before any component: {e}")
    storage.makedirs(FLAGS.pipeline_root)
    if metadata.HasField("sqlite"):
        storage.makedirs(os.path.dirname(metadata.sqlite.filename_uri))
    print(f"Running pipeline {FLAGS.pipeline_name} on {spec.describe()}; artifacts in "
          f"{storage.absolute(FLAGS.pipeline_root)}, metadata in {where}", file=sys.stderr, flush=True)
    start = time.time()
    _run_local(pipeline)
    summary = summarise_run(metadata, where, FLAGS.pipeline_root, FLAGS.pipeline_name)
    summary["seconds"] = round(time.time() - start, 1)
    if summary["pushed"]:
        print(f"Pushed to {summary['serving_model_path']} (serve it with models.config in "
              f"{storage.absolute(FLAGS.serving_dir)})", file=sys.stderr)
    else:
        print(f"Nothing pushed: {summary.get('reason')}", file=sys.stderr)
    print(json.dumps(summary), flush=True)


def run():
    from keras_vit.cli import run_app

    _define_flags()
    run_app(main)


if __name__ == "__main__":
    run()
