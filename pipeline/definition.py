"""The pipeline definition: which components, wired how. Runners live in `pipeline.run`.

    ImageExampleGen -> StatisticsGen -> SchemaGen -> CurateSchema -> ExampleValidator
      -> ValidationGate -> Dedup -> Trainer -> Evaluator (vs the latest blessed model)
      -> ServingPusher
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import List, Optional

import tensorflow_model_analysis as tfma
from tfx import v1 as tfx

from keras_vit import precision
from keras_vit.training import ConfigError
from pipeline import components, ingest

# A module path rather than a module file: TFX then builds no wheel, and the same
# spec runs wherever keras_vit is installed (the Kubeflow image).
RUN_FN = "pipeline.trainer_module.run_fn"
_CODE_DIRS = ("keras_vit", "pipeline")
TOP1, TOP5 = "sparse_categorical_accuracy", "sparse_top_k_categorical_accuracy"


def eval_config(accuracy_threshold: float) -> tfma.EvalConfig:
    """Top-1 and top-5 on eval through the serialized-Example signature; blessing needs
    top-1 >= `accuracy_threshold` and no worse than the latest blessed model."""
    return tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(signature_name="serving_examples", label_key=ingest.LABEL,
                                    prediction_key="probabilities")],
        slicing_specs=[tfma.SlicingSpec()],
        metrics_specs=[tfma.MetricsSpec(metrics=[
            tfma.MetricConfig(class_name="ExampleCount"),
            tfma.MetricConfig(
                class_name="SparseCategoricalAccuracy",
                threshold=tfma.MetricThreshold(
                    value_threshold=tfma.GenericValueThreshold(lower_bound={"value": accuracy_threshold}),
                    change_threshold=tfma.GenericChangeThreshold(
                        direction=tfma.MetricDirection.HIGHER_IS_BETTER, absolute={"value": -1e-10}))),
            tfma.MetricConfig(class_name="SparseTopKCategoricalAccuracy", config=json.dumps({"k": 5})),
            # Per-class accuracy for the model card, from the argmax confusion matrix.
            tfma.MetricConfig(class_name="MultiClassConfusionMatrixPlot"),
        ])])


def code_digest() -> str:
    """A digest of the package sources: the Trainer's cache key changes with the code."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    digest = hashlib.sha256()
    for d in _CODE_DIRS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, d)):
            dirnames[:] = sorted(n for n in dirnames if n != "__pycache__")
            for name in sorted(n for n in filenames if n.endswith(".py")):
                with open(os.path.join(dirpath, name), "rb") as f:
                    digest.update(name.encode() + f.read())
    return digest.hexdigest()[:16]


def create_pipeline(
    *,
    pipeline_name: str,
    pipeline_root: str,
    source: ingest.SourceSpec,
    input_fingerprint: str,
    train_config: dict,
    train_steps: int,
    serving_dir: str,
    model_name: str,
    dedup_threshold: float,
    accuracy_threshold: float,
    metadata_config,
    beam_pipeline_args: List[str],
    enable_cache: bool = True,
    serving_precision: Optional[str] = None,
) -> tfx.dsl.Pipeline:
    """The pipeline object. `metadata_config` is ML Metadata's `ConnectionConfig` for a
    local run; None leaves ML Metadata to the orchestrator (Kubeflow).

    Raises ValueError for a `train_config` the Trainer would refuse, so that a bad
    flag fails here rather than after ingestion, statistics and de-duplication. Its
    `weights` must exist here only for a local run (`metadata_config` set), which
    trains on this machine. `serving_precision` is the dtype policy the pushed
    SavedModel computes in (one of `keras_vit.precision.PRECISIONS`); None
    keeps the training precision.
    """
    import tensorflow_data_validation as tfdv

    from pipeline import trainer_module

    if serving_precision is not None and serving_precision not in precision.PRECISIONS:
        raise ConfigError(f"serving_precision must be one of {precision.PRECISIONS} or None, "
                          f"got {serving_precision!r}")
    custom_config = {**train_config, "model_name": model_name, "code_digest": code_digest(),
                     "serving_precision": serving_precision}
    trainer_module.train_config(custom_config, train_steps, output_dir=pipeline_root).validate(
        check_paths=metadata_config is not None)

    example_gen = components.ImageExampleGen(
        source=json.dumps(dataclasses.asdict(source)), input_fingerprint=input_fingerprint)
    statistics_gen = tfx.components.StatisticsGen(
        examples=example_gen.outputs["examples"],
        stats_options=tfdv.StatsOptions(enable_semantic_domain_stats=True))
    schema_gen = tfx.components.SchemaGen(statistics=statistics_gen.outputs["statistics"],
                                          infer_feature_shape=False)
    curate = components.CurateSchema(schema=schema_gen.outputs["schema"],
                                     examples=example_gen.outputs["examples"])
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=curate.outputs["curated_schema"])
    gate = components.ValidationGate(anomalies=example_validator.outputs["anomalies"])
    dedup = components.Dedup(examples=example_gen.outputs["examples"], threshold=dedup_threshold)
    dedup.add_upstream_node(gate)
    trainer = tfx.components.Trainer(
        run_fn=RUN_FN,
        examples=dedup.outputs["deduplicated_examples"],
        schema=curate.outputs["curated_schema"],
        train_args=tfx.proto.TrainArgs(splits=["train"], num_steps=int(train_steps)),
        eval_args=tfx.proto.EvalArgs(splits=["eval"]),
        custom_config=custom_config)
    baseline = tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
    ).with_id("latest_blessed_model_resolver")
    evaluator = tfx.components.Evaluator(
        examples=dedup.outputs["deduplicated_examples"],
        model=trainer.outputs["model"],
        baseline_model=baseline.outputs["model"],
        example_splits=["eval"],
        eval_config=eval_config(accuracy_threshold))
    pusher = components.ServingPusher(
        model=trainer.outputs["model"], model_blessing=evaluator.outputs["blessing"],
        evaluation=evaluator.outputs["evaluation"], model_run=trainer.outputs["model_run"],
        examples=dedup.outputs["deduplicated_examples"], dedup_report=dedup.outputs["report"],
        serving_dir=serving_dir, model_name=model_name, code_digest=custom_config["code_digest"])
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=[example_gen, statistics_gen, schema_gen, curate, example_validator, gate, dedup, trainer,
                    baseline, evaluator, pusher],
        enable_cache=enable_cache,
        metadata_connection_config=metadata_config,
        beam_pipeline_args=beam_pipeline_args)
