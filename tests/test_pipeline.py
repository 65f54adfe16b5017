"""The TFX pipeline end to end, through `python -m pipeline.run`, on a few hundred images.

Each run is a fresh process (the CLI users run); the runs share one pipeline root,
ML Metadata store and serving directory, in order:
  1. a first run: every component executes, planted copies are removed, a model is pushed;
  2. the same run again: cached through the Trainer, nothing pushed;
  3. a worse model (learning rate 0): evaluated, not blessed, not pushed.
A separate run over TFRecords with a bad label and a missing image stops before training.
"""

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from keras_vit import fashion_mnist
from keras_vit.training import ConfigError
from conftest import write_bad_images
from planting import example_record, png, write_image_folder

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPONENTS = ("ImageExampleGen", "StatisticsGen", "SchemaGen", "CurateSchema", "ExampleValidator",
              "ValidationGate", "Dedup", "Trainer", "latest_blessed_model_resolver", "Evaluator",
              "ServingPusher")
SMALL = ["--train_steps=60", "--batch_size=32", "--warmup_steps=10", "--accuracy_threshold=0.2"]


def run_pipeline(*flags, check=True):
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "pipeline.run", *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stderr[-6000:]
        return json.loads(proc.stdout.strip().splitlines()[-1]), proc
    return None, proc


def open_metadata(metadata_path):
    """The run's ML Metadata store, read-only."""
    from ml_metadata.metadata_store import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


def executions(metadata_path):
    """node id -> states of its executions, read from ML Metadata directly."""
    from ml_metadata.proto import metadata_store_pb2

    store = open_metadata(metadata_path)
    out = {}
    for ctx in store.get_contexts_by_type("node"):
        out[ctx.name.split(".", 1)[1]] = [metadata_store_pb2.Execution.State.Name(e.last_known_state)
                                          for e in store.get_executions_by_context(ctx.id)]
    return out


@pytest.fixture(scope="module")
def fmnist():
    if not os.path.exists(os.path.join(fashion_mnist.DEFAULT_DIR, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("dataset-fashion-mnist not installed (make test installs it)")
    return fashion_mnist.load_arrays("train"), fashion_mnist.load_arrays("test")


@pytest.fixture(scope="module")
def runs(fmnist, tmp_path_factory):
    (train_x, train_y), (test_x, test_y) = fmnist
    base = tmp_path_factory.mktemp("pipeline")
    images = str(base / "images")
    planted = write_image_folder(images, train_x, train_y, test_x, test_y, fashion_mnist.CLASS_NAMES)
    bad = write_bad_images(base / "images" / "train" / "coat")  # left out and counted
    # Trained in bf16 and served in float32, as for CPUs without fast bf16.
    common = [f"--image_dir={images}", f"--pipeline_root={base / 'root'}",
              f"--serving_dir={base / 'serving'}", "--model_name=fmnist",
              "--precision=mixed_bfloat16", "--serving_precision=float32", "--skip_bad_records"]
    first = run_pipeline(*common, *SMALL)
    second = run_pipeline(*common, *SMALL)
    worse = run_pipeline(*common, *[f for f in SMALL if "accuracy" not in f], "--learning_rate=0",
                         "--accuracy_threshold=0")
    return {"base": base, "planted": planted, "bad": bad, "first": first, "second": second, "worse": worse,
            "metadata": str(base / "root" / "metadata.sqlite")}


def test_first_run_executes_every_component_and_pushes(runs):
    summary, proc = runs["first"]
    assert set(summary["executions"]) == set(COMPONENTS)
    assert set(summary["executions"].values()) == {"COMPLETE"}
    assert summary["pushed"] is True
    assert summary["serving_model_path"] == str(runs["base"] / "serving" / "fmnist" / "1")
    assert 0.2 <= summary["accuracy"] <= 1.0
    assert summary["pipeline_root"] == str(runs["base"] / "root")
    for name in ("ImageExampleGen", "Dedup", "Trainer", "Evaluator", "ServingPusher"):
        assert f"] {name} done in" in proc.stderr  # progress per component
    assert "property_predicate is not supported" not in proc.stderr  # TFX's false alarm, dropped
    assert "ran out of data" not in proc.stderr  # Keras's, on the Trainer's eval pass over TFRecords
    assert proc.stderr.count("is deprecated and will be removed") <= 1  # TFMA's, once, not twice
    assert os.path.exists(runs["base"] / "serving" / "models.config")
    tuned = (runs["base"] / "serving" / "batching_parameters.txt").read_text()
    assert tuned.startswith("# Measured for fmnist version 1 on ") and "max_batch_size { value: " in tuned


def test_mlmd_holds_the_executions_of_every_component(runs):
    states = executions(runs["metadata"])
    assert set(COMPONENTS) <= set(states)
    for name in COMPONENTS:
        assert "COMPLETE" in states[name], (name, states[name])


def test_statistics_include_image_statistics(runs):
    from tensorflow_metadata.proto.v0 import statistics_pb2

    (stats_dir,) = (runs["base"] / "root" / "StatisticsGen" / "statistics").iterdir()
    stats = statistics_pb2.DatasetFeatureStatisticsList.FromString(
        (stats_dir / "Split-train" / "FeatureStats.pb").read_bytes())
    features = {f.path.step[0]: f for f in stats.datasets[0].features}
    assert set(features) == {"image", "label", "label_name", "source_id", "hash"}
    assert "image_format_histogram" in {c.name for c in features["image"].custom_stats}


def test_planted_copies_were_removed(runs):
    summary, _ = runs["first"]
    report_dirs = sorted((runs["base"] / "root" / "Dedup" / "report").iterdir(), key=lambda p: int(p.name))
    report = json.loads((report_dirs[0] / "report.json").read_text())
    removed = {p["train_id"] for p in report["pairs"]}
    planted = runs["planted"]
    assert removed >= set(planted), sorted(set(planted) - removed)
    assert len(removed - set(planted)) <= 3  # Fashion-MNIST holds a few real near-copies
    by_split = {"test": sum(v[1] == "test" for v in planted.values()),
                "eval": sum(v[1] == "eval" for v in planted.values())}
    for split, n in by_split.items():
        assert summary["dedup"][split] >= n
    kinds = report["pairs_by_split_and_kind"]["test"]
    assert kinds["exact"] >= 4 and kinds["near"] >= 16
    assert (report_dirs[0] / "contact_sheet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The Trainer's data no longer holds them; eval and test pass unchanged.
    deduped = sorted((runs["base"] / "root" / "Dedup" / "deduplicated_examples").iterdir())[0]
    ids = set()
    spec = {"source_id": tf.io.FixedLenFeature([], tf.string)}
    for r in tf.data.TFRecordDataset(tf.io.gfile.glob(str(deduped / "Split-train" / "*")), "GZIP"):
        ids.add(tf.io.parse_single_example(r, spec)["source_id"].numpy().decode())
    assert not ids & set(planted)
    assert len(ids) == 300 + len(planted) - len(removed)


def artifact(metadata_path, artifact_id):
    """An ML Metadata artifact by id: (uri, custom properties as strings or ints)."""
    (found,) = open_metadata(metadata_path).get_artifacts_by_id([artifact_id])
    props = {k: v.string_value or v.int_value for k, v in found.custom_properties.items()}
    return found.uri, props


def producers(metadata_path):
    """ML Metadata's own record: artifact id -> (component, execution id) that output it,
    and execution id -> the artifact ids it took as inputs."""
    from ml_metadata.proto import metadata_store_pb2

    store = open_metadata(metadata_path)
    node_of = {e.id: ctx.name.split(".", 1)[1] for ctx in store.get_contexts_by_type("node")
               for e in store.get_executions_by_context(ctx.id)}
    made, took = {}, {}
    # A cached execution of a later run records the artifact it reused as an output too:
    # the artifact's maker is its first.
    for ev in sorted(store.get_events_by_execution_ids(list(node_of)), key=lambda ev: ev.execution_id):
        if ev.type == metadata_store_pb2.Event.OUTPUT:
            made.setdefault(ev.artifact_id, (node_of[ev.execution_id], ev.execution_id))
        elif ev.type == metadata_store_pb2.Event.INPUT:
            took.setdefault(ev.execution_id, []).append(ev.artifact_id)
    return made, took


def test_the_pushed_model_has_a_card_that_agrees_with_the_artifacts_that_made_it(runs):
    import tensorflow_model_analysis as tfma

    summary, _ = runs["first"]
    version = summary["serving_model_path"]
    card = json.loads(open(os.path.join(version, "model_card.json")).read())
    page = open(os.path.join(version, "model_card.md")).read()
    assert card["model_name"] == "fmnist" and card["version"] == 1 and card["blessing"].startswith("blessed")
    assert page.startswith("# fmnist version 1\n") and "\n| t-shirt-top | " in page

    # The Evaluator's numbers, read from its artifact through the card's MLMD id.
    evaluation_uri, _ = artifact(runs["metadata"], card["mlmd"]["artifacts"]["evaluation"])
    overall = {kv.key.name: kv.value.double_value.value
               for m in tfma.load_metrics(evaluation_uri) if not m.slice_key.single_slice_keys
               for kv in m.metric_keys_and_values
               if not kv.key.is_diff and kv.key.model_name in ("", "candidate")
               and not kv.key.HasField("sub_key")}
    metrics = card["evaluation"]["metrics"]
    assert metrics["sparse_categorical_accuracy"] == overall["sparse_categorical_accuracy"]
    assert round(metrics["sparse_categorical_accuracy"], 6) == summary["accuracy"]
    per_class = card["evaluation"]["per_class"]
    assert list(per_class) == sorted(os.listdir(runs["base"] / "images" / "train"))  # the folders
    count = sum(c["examples"] for c in per_class.values())
    assert count == overall["example_count"] == card["data"]["split_counts"]["eval"]
    # Per-class top-1, weighted by the class sizes, is the overall top-1.
    weighted = sum(c["accuracy"] * c["examples"] for c in per_class.values() if c["examples"]) / count
    assert weighted == pytest.approx(metrics["sparse_categorical_accuracy"], abs=1e-6)

    # Dedup's numbers, from its report artifact and the deduplicated examples.
    _, report = artifact(runs["metadata"], card["mlmd"]["artifacts"]["dedup_report"])
    data = card["data"]
    assert data["dedup_removed_by_reference"] == json.loads(report["removed"]) == summary["dedup"]
    assert data["dedup_removed_total"] == report["removed_total"]
    _, examples = artifact(runs["metadata"], card["mlmd"]["artifacts"]["examples"])
    assert data["split_counts"] == json.loads(examples["split_counts"])
    before = data["split_counts_before_dedup"]
    assert data["split_counts"]["train"] == before["train"] - report["removed_total"]
    assert data["source"].startswith("image folder ")
    # Each kind of bad file was left out of train and counted, by ImageExampleGen.
    skipped = json.loads(examples["bad_records_skipped"])
    assert data["bad_records_skipped"] == {"train": len(runs["bad"])} == skipped

    # The executions that made it, as ML Metadata's events record them.
    made, took = producers(runs["metadata"])
    ids, runs_of = card["mlmd"]["artifacts"], card["mlmd"]["executions"]
    for name, component in (("examples", "Dedup"), ("dedup_report", "Dedup"), ("model", "Trainer"),
                            ("model_run", "Trainer"), ("evaluation", "Evaluator"), ("blessing", "Evaluator")):
        assert made[ids[name]] == (component, runs_of[component]), name
    assert ("ImageExampleGen", runs_of["ImageExampleGen"]) in {made[a] for a in took[runs_of["Dedup"]]}
    assert {ids["model"], ids["blessing"]} <= set(took[runs_of["ServingPusher"]])
    assert "ML Metadata executions: ImageExampleGen " in page

    run_uri, _ = artifact(runs["metadata"], card["mlmd"]["artifacts"]["model_run"])
    trainer = json.loads(open(os.path.join(run_uri, "metrics.json")).read())
    assert card["model"] == {"name": trainer["model"], "config": trainer["model_config"],
                             "params": trainer["params"], "macs": trainer["macs"]}
    assert card["training"] == {k: trainer[k] for k in ("recipe", "steps", "batch_size", "precision",
                                                        "train_seconds")}
    assert card["training"]["precision"] == "mixed_bfloat16"
    assert card["code_digest"] and len(card["code_digest"]) >= 12


def test_pushed_model_loads_and_predicts(runs):
    summary, proc = runs["first"]
    assert "serving model (float32) in" in proc.stdout  # --serving_precision, not the bf16 training
    code = (
        "import sys, tensorflow as tf\n"
        "m = tf.saved_model.load(sys.argv[1])\n"
        "f = m.signatures['serving_default']\n"
        "out = f(image_bytes=tf.constant([open(sys.argv[2], 'rb').read()]))\n"
        "g = f.graph.as_graph_def()\n"
        "ops = [*g.node, *(n for x in g.library.function for n in x.node_def)]\n"
        "bf16 = any(a.type == tf.bfloat16.as_datatype_enum for n in ops for a in n.attr.values())\n"
        "print(out['class_names'].numpy()[0].decode(), float(tf.reduce_sum(out['probabilities'])),\n"
        "      sorted({v.dtype.name for v in m.variables if v.dtype.is_floating}),\n"
        "      bf16, sep='\\t')\n")
    image = next(p for p in runs["planted"] if p.endswith(".png"))
    proc = subprocess.run([sys.executable, "-c", code, summary["serving_model_path"],
                           os.path.join(runs["base"], "images", image)],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, total, dtypes, any_bf16 = proc.stdout.strip().split("\t")
    assert name in os.listdir(os.path.join(runs["base"], "images", "train"))  # folder names are the classes
    assert abs(float(total) - 1.0) < 1e-4
    assert (dtypes, any_bf16) == ("['float32']", "False")  # float32 weights, and no bf16 op


def test_second_run_reuses_the_cache_and_pushes_nothing(runs):
    summary, _ = runs["second"]
    for name in COMPONENTS[:COMPONENTS.index("Trainer") + 1]:
        assert summary["executions"][name] == "CACHED", (name, summary["executions"])
    assert summary["pushed"] is False
    assert "already served as version 1" in summary["reason"]
    assert sorted(os.listdir(runs["base"] / "serving" / "fmnist")) == ["1"]


def test_worse_model_is_not_pushed(runs):
    summary, proc = runs["worse"]
    assert summary["executions"]["Trainer"] == "COMPLETE"
    assert summary["executions"]["Evaluator"] == "COMPLETE"
    assert summary["pushed"] is False
    assert summary["reason"].startswith("not blessed")
    assert "sparse_categorical_accuracy changed by -0." in summary["reason"]
    assert "against the latest blessed model" in summary["reason"]
    assert summary["accuracy"] < runs["first"][0]["accuracy"]
    assert sorted(os.listdir(runs["base"] / "serving" / "fmnist")) == ["1"]


def test_failed_thresholds_read_as_sentences():
    """TFMA leaves the failure message empty; the reason names the value and the threshold."""
    from google.protobuf import text_format
    from tensorflow_model_analysis.proto import validation_result_pb2

    from pipeline.components import failure_sentence

    def failure(text):
        return text_format.Parse(text, validation_result_pb2.ValidationFailure())

    change = failure('metric_key { name: "acc" is_diff: true } '
                     'metric_value { double_value { value: -0.0045 } } '
                     'metric_threshold { change_threshold { absolute { value: -1e-10 } '
                     'direction: HIGHER_IS_BETTER } }')
    assert failure_sentence(change) == ("acc changed by -0.0045 against the latest blessed model; "
                                        "the absolute change must be at least -1e-10")
    value = failure('metric_key { name: "acc" } metric_value { double_value { value: 0.1 } } '
                    'metric_threshold { value_threshold { lower_bound { value: 0.6 } '
                    'upper_bound { value: 1 } } }')
    assert failure_sentence(value) == "acc is 0.1000; it must be >= 0.6 and <= 1"
    assert failure_sentence(failure('metric_key { name: "acc" } message: "boom"')) == "acc: boom"


def test_tfx_false_property_predicate_warning_is_dropped_only_when_false():
    """TFX 1.16 warns "ArtifactQuery.property_predicate is not supported." for every input
    (it tests a protobuf message for truth); the runner drops it unless a channel sets one."""
    from tfx.dsl.compiler import compiler

    from pipeline import definition, ingest
    from pipeline.run import beam_args, uses_property_predicates

    pipeline = definition.create_pipeline(
        pipeline_name="p", pipeline_root="/nonexistent/root",
        source=ingest.SourceSpec(tfrecords={"train": "/x/*"}),
        input_fingerprint="0", train_config={}, train_steps=1, serving_dir="/nonexistent/serving",
        model_name="m", dedup_threshold=0.9, accuracy_threshold=0.5, metadata_config=None,
        beam_pipeline_args=beam_args(1))
    ir = compiler.Compiler().compile(pipeline)
    assert not uses_property_predicates(ir)
    inputs = next(node.pipeline_node.inputs.inputs for node in ir.nodes
                  if node.pipeline_node.node_info.id == "Trainer")
    inputs["examples"].channels[0].artifact_query.property_predicate.value_comparator.property_name = "span"
    assert uses_property_predicates(ir)


def test_flags_that_cannot_train_stop_the_run_before_any_component(tmp_path):
    missing = tmp_path / "missing.npz"
    _, proc = run_pipeline("--dataset=fashion_mnist_local/mini", f"--pipeline_root={tmp_path / 'root'}",
                           "--model=ViT-X/16", f"--weights={missing}", "--batch_size=0", check=False)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "bad training config:\n  recipe 'pretrain': batch_size must be a whole number >= 1" in proc.stderr
    assert "\n  model 'ViT-X/16': unknown model 'ViT-X/16'" in proc.stderr
    assert (f"\n  weights {missing} not found (nor a pretrained name: python -m keras_vit.zoo --pretrained)"
            "\nPass --helpshort") in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "root").exists()


def test_a_root_on_a_filesystem_tensorflow_lacks_stops_the_run_before_any_component(tmp_path):
    _, proc = run_pipeline("--dataset=fashion_mnist_local/mini", "--pipeline_root=nosuch://bucket/root",
                           f"--metadata_path={tmp_path / 'm.sqlite'}", check=False)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "nosuch://bucket/root: TensorFlow has no filesystem for nosuch://" in proc.stderr
    assert "Traceback" not in proc.stderr and not os.path.exists(os.path.join(ROOT, "nosuch:"))


def test_ml_metadata_stays_local_or_goes_to_mysql(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from pipeline.run import metadata_connection

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MYSQL_PWD", "secret")

    def connect(**flags):
        defaults = {"pipeline_name": "p", "pipeline_root": "runs/pipeline", "metadata_path": None,
                    "metadata_mysql": None}
        return metadata_connection(SimpleNamespace(**{**defaults, **flags}))

    config, where = connect()
    assert where == os.path.join("runs/pipeline", "metadata.sqlite")
    assert config.sqlite.filename_uri == str(tmp_path / "runs" / "pipeline" / "metadata.sqlite")
    config, where = connect(pipeline_root="gs://bucket/root")  # SQLite cannot live in a bucket
    assert config.sqlite.filename_uri == str(tmp_path / "runs" / "metadata" / "p.sqlite")
    assert not os.path.exists(tmp_path / "gs:")
    config, where = connect(metadata_mysql="tfx@db.internal:3307/mlmd")
    assert (config.mysql.host, config.mysql.port, config.mysql.database, config.mysql.user,
            config.mysql.password) == ("db.internal", 3307, "mlmd", "tfx", "secret")
    assert where == "MySQL tfx@db.internal:3307/mlmd"
    assert connect(metadata_mysql="tfx@db/mlmd")[0].mysql.port == 3306
    with pytest.raises(ConfigError, match="user@host"):
        connect(metadata_mysql="db.internal/mlmd")
    with pytest.raises(ConfigError, match="not both"):
        connect(metadata_mysql="tfx@db/mlmd", metadata_path="m.sqlite")
    with pytest.raises(ConfigError, match="SQLite needs a local file"):
        connect(metadata_path="gs://bucket/m.sqlite")


def test_the_definition_checks_the_trainer_config_and_local_weights_only():
    from tfx import v1 as tfx

    from pipeline import definition, ingest
    from pipeline.run import beam_args

    def create(train_config, metadata_config, **kwargs):
        return definition.create_pipeline(
            pipeline_name="p", pipeline_root="/nonexistent/root",
            source=ingest.SourceSpec(tfrecords={"train": "/x"}), input_fingerprint="0",
            train_config=train_config, train_steps=1, serving_dir="/nonexistent/serving", model_name="m",
            dedup_threshold=0.9, accuracy_threshold=0.5, metadata_config=metadata_config,
            beam_pipeline_args=beam_args(1), **kwargs)

    with pytest.raises(ConfigError, match="serving_precision must be one of"):
        create({}, metadata_config=None, serving_precision="bf16")
    with pytest.raises(ConfigError, match="precision must be one of"):
        create({"precision": "fp8"}, metadata_config=None)
    with pytest.raises(ConfigError, match="weights /nonexistent/ViT-B_16.npz not found"):
        sqlite = tfx.orchestration.metadata.sqlite_metadata_connection_config("/nonexistent/m.sqlite")
        create({"weights": "/nonexistent/ViT-B_16.npz"}, metadata_config=sqlite)
    # A spec for an orchestrator elsewhere names files on its machines.
    create({"weights": "/nonexistent/ViT-B_16.npz"}, metadata_config=None)


def test_anomalies_stop_the_run_before_training(fmnist, tmp_path):
    (train_x, train_y), _ = fmnist
    records = [example_record(png(train_x[i]), int(train_y[i]) % 2) for i in range(60)]
    bad = records[:30] + [example_record(png(train_x[70]), 7), example_record(None, 1)] + records[30:]
    for name, rows in (("train", bad), ("eval", records[:20])):
        with tf.io.TFRecordWriter(str(tmp_path / f"{name}.tfrecord")) as w:
            for r in rows:
                w.write(r)
    tfrecords = f"train={tmp_path / 'train.tfrecord'},eval={tmp_path / 'eval.tfrecord'}"
    _, proc = run_pipeline(f"--tfrecords={tfrecords}",
                           "--class_names=even,odd", f"--pipeline_root={tmp_path / 'root'}",
                           f"--serving_dir={tmp_path / 'serving'}", "--train_steps=2", check=False)
    assert proc.returncode != 0
    assert "data validation found anomalies; the run stops before training" in proc.stderr
    assert "train: feature 'label'" in proc.stderr
    assert "train: feature 'image'" in proc.stderr
    states = executions(str(tmp_path / "root" / "metadata.sqlite"))
    assert "Trainer" not in states and "Dedup" not in states
    assert not os.path.exists(tmp_path / "serving")


def test_the_pipeline_image_is_tfxs_own_with_the_locked_environment():
    """Docker cannot build here: the Dockerfile is checked against the lock and what the
    compiled spec names (the Trainer's module, found on PYTHONPATH)."""
    import re

    lines = [line.split("#")[0].strip() for line in open(os.path.join(ROOT, "Dockerfile"))]
    steps = [line for line in lines if line]
    lock = open(os.path.join(ROOT, "requirements", "lock.txt")).read()
    (tfx_version,) = re.findall(r"^tfx==(\S+)$", lock, re.M)
    assert steps[0] == f"FROM gcr.io/tfx-oss-public/tfx:{tfx_version}"
    assert "RUN pip install --no-cache-dir -r requirements/lock.txt" in steps
    copied = [line.split()[1] for line in steps if line.startswith("COPY")]
    assert copied == ["requirements/lock.txt", "keras_vit", "pipeline"]
    workdir = next(line.split()[1] for line in steps if line.startswith("WORKDIR"))
    assert f"ENV PYTHONPATH={workdir}" in steps
    assert os.path.exists(os.path.join(ROOT, "pipeline", "trainer_module.py"))
    kept = [line[1:] for line in open(os.path.join(ROOT, ".dockerignore")).read().split() if line[0] == "!"]
    assert sorted(kept) == sorted(copied)  # the build context holds what is copied, nothing else


def test_kubeflow_v2_spec_compiles(tmp_path):
    out = tmp_path / "spec.json"
    _, proc = run_pipeline("--orchestrator=kubeflow_v2", f"--kubeflow_output={out}",
                           "--dataset=fashion_mnist_local/mini", "--pipeline_root=gs://bucket/root",
                           "--serving_dir=gs://bucket/serving", "--kubeflow_image=registry/keras-vit:7",
                           "--beam_pipeline_args=--runner=DataflowRunner,--project=p,--region=r", check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"Wrote the Kubeflow V2 pipeline spec to {out}" in proc.stdout
    spec = json.loads(out.read_text())
    tasks = spec["pipelineSpec"]["root"]["dag"]["tasks"]
    for name in COMPONENTS[:-3] + COMPONENTS[-2:]:
        assert name in tasks, (name, sorted(tasks))
    assert any(t.startswith("latest_blessed_model_resolver") for t in tasks)
    assert "ValidationGate" in tasks["Dedup"]["dependentTasks"]
    executors = spec["pipelineSpec"]["deploymentSpec"]["executors"]
    containers = {name: e["container"] for name, e in executors.items() if "container" in e}
    assert {c["image"] for c in containers.values()} == {"registry/keras-vit:7"}
    for component in ("ImageExampleGen", "StatisticsGen", "Dedup", "Evaluator"):  # Beam's
        args = containers[f"{component}_executor"]["args"]
        assert args[-3:] == ["--runner=DataflowRunner", "--project=p", "--region=r"], (component, args)
    assert spec["runtimeConfig"]["gcsOutputDirectory"] == "gs://bucket/root"

    def parameter(task, name):
        return tasks[task]["inputs"]["parameters"][name]["runtimeValue"]["constantValue"]["stringValue"]

    assert parameter("Trainer", "run_fn") == "pipeline.trainer_module.run_fn"  # found in the image
    assert parameter("ServingPusher", "serving_dir") == "gs://bucket/serving"
    assert not os.path.exists(os.path.join(ROOT, "gs:"))  # compiling writes nothing to the pipeline root


def test_beam_workers_that_cannot_start_stop_the_run_in_bounded_time(beam_services, tmp_path):
    """Beam itself would wait forever for a worker that exits at start."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # what the pool starts its workers with
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'apache_beam'\" >&2\nexit 1\n")
    python.chmod(0o755)
    _, proc = run_pipeline("--dataset=fashion_mnist_local/mini", f"--pipeline_root={tmp_path / 'root'}",
                           "--beam_worker_timeout=20", *beam_services(f"{bin_dir}{os.pathsep}/usr/bin:/bin"),
                           check=False)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Stopped before any component: the Beam workers on PortableRunner with EXTERNAL workers at " \
           "localhost:" in proc.stderr
    assert "did not run a one-element job within 20 s" in proc.stderr
    assert not (tmp_path / "root").exists()


def test_a_tfds_sources_fingerprint_follows_its_version_and_data_dir(tmp_path):
    from pipeline import ingest
    from pipeline.run import input_fingerprint

    def fingerprint(name, data_dir):
        return input_fingerprint(ingest.SourceSpec(dataset=name, data_dir=str(tmp_path / data_dir)))

    assert fingerprint("fashion_mnist_local", "a") == fingerprint("fashion_mnist_local", "a")
    assert fingerprint("fashion_mnist_local", "a") != fingerprint("fashion_mnist_local", "b")
    assert fingerprint("fashion_mnist_local", "a") != fingerprint("mnist", "a")
