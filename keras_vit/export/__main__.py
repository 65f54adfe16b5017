"""Export a model for TF Serving: `python -m keras_vit.export` (console script keras-vit-export).

    python -m keras_vit.export --model=vit.keras --output_dir=saved_models/vit \
        --class_names=cat,dog
    python -m keras_vit.export --model=ViT-B_16.npz --output_dir=saved_models/vit_b16 \
        --class_names_file=imagenet_classes.txt
"""

from __future__ import annotations

import sys

from keras_vit import batching, precision, preprocessing, storage
from keras_vit.export import export_saved_model


def main(argv):
    from absl import flags

    from keras_vit.data import quiet_info_logs

    FLAGS = flags.FLAGS
    del argv
    quiet_info_logs()
    from keras_vit import pretrained
    from keras_vit.cli import load_model_or_exit

    storage.check(FLAGS.output_dir)  # before the model is read
    model = load_model_or_exit(FLAGS.model, FLAGS.image_size)
    if FLAGS.precision is not None:
        model = precision.to_precision(model, FLAGS.precision)
    names = None
    if FLAGS.class_names_file:
        lines = storage.read_text(FLAGS.class_names_file).splitlines()
        names = [line.strip() for line in lines if line.strip()]
    elif FLAGS.class_names:
        names = FLAGS.class_names
    elif not FLAGS.model.endswith(".keras") and model.config.num_classes:
        names = pretrained.class_names(FLAGS.model)  # a checkpoint's own, or the registry's
    stored = precision.compute_dtype_twin(model) if FLAGS.weights_in_compute_dtype else model
    dtypes = sorted({w.dtype for w in stored.weights})
    print(f"Exporting {FLAGS.model} (policy {precision.model_policy(model)}, weights stored as "
          f"{', '.join(dtypes)})" + (", then timing it for batching_parameters.txt" if FLAGS.tune_batching
                                     else "") + " ...", file=sys.stderr)
    out = export_saved_model(stored, FLAGS.output_dir, class_names=names, version=FLAGS.version,
                             top_k=FLAGS.top_k, activation=FLAGS.activation,
                             models_config_prefix=FLAGS.models_config_prefix,
                             weights_in_compute_dtype=FLAGS.weights_in_compute_dtype,
                             max_pixels=FLAGS.max_pixels, tune_batching=FLAGS.tune_batching)
    root = storage.parent(FLAGS.output_dir)
    written = [storage.join(root, "models.config")]
    if FLAGS.tune_batching:
        written.append(storage.join(root, batching.FILENAME))
    print(f"Wrote SavedModel to {out} and {', '.join(written)}")


def _define_flags():
    from absl import flags

    flags.DEFINE_string("model", None, "A .keras file, an official .npz, a Hugging Face ViT directory, "
                        "or pretrained weights by name (python -m keras_vit.zoo --pretrained).",
                        required=True)
    flags.DEFINE_integer("image_size", None,
                         "Serving resolution for a checkpoint (position embeddings are interpolated).")
    flags.DEFINE_string("output_dir", None, "Model base directory, e.g. saved_models/vit.", required=True)
    flags.DEFINE_list("class_names", None,
                      "Comma-separated class names (default: a Hugging Face checkpoint's id2label).")
    flags.DEFINE_string("class_names_file", None, "File with one class name per line.")
    flags.DEFINE_integer("version", None, "Version number (default: next free).")
    flags.DEFINE_integer("top_k", 5, "Classes in the top-k outputs.")
    flags.DEFINE_enum("activation", "softmax", ["softmax", "sigmoid"], "Output activation.")
    flags.DEFINE_string("models_config_prefix", None,
                        "Base-path prefix in models.config, e.g. /models inside the TF Serving container.")
    flags.DEFINE_enum("precision", None, list(precision.PRECISIONS),
                      "Dtype policy the SavedModel computes in, wherever it is served; default the one the "
                      "model file names (float32 for keras_vit.train's). bf16 is fast only on "
                      "AMX/AVX512-BF16 CPUs and recent GPUs, and auto means this machine's.")
    flags.DEFINE_bool("weights_in_compute_dtype", True,
                      "Under a mixed policy, store the weights in the compute dtype "
                      "(same outputs, half the size).")
    flags.DEFINE_integer("max_pixels", preprocessing.DEFAULT_MAX_PIXELS,
                         "The most pixels a served image may declare in its header; larger ones are "
                         "refused before decoding (default: a 200 MP phone photo passes).", lower_bound=1)
    flags.DEFINE_bool("tune_batching", True,
                      "Time the exported model at growing batch sizes and write TF Serving's "
                      "batching_parameters.txt beside models.config.")


def run():
    """Console entry point; flags are defined here so importing the module defines none."""
    from keras_vit.cli import run_app

    _define_flags()
    run_app(main)


if __name__ == "__main__":
    run()
