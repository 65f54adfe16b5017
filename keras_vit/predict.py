"""Top-k classes of images: `python -m keras_vit.predict --model=NAME IMAGES...`.

    # Pretrained weights by name (downloaded once), ImageNet class names.
    python -m keras_vit.predict --model=vit_base_patch16_224.augreg_in21k_ft_in1k photo.jpg

    # A trained model on a folder and a URL, as JSON.
    python -m keras_vit.predict --model=runs/vit/model.keras --json photos/ https://host/cat.jpg

IMAGES are files, folders (searched recursively), globs, http(s) URLs, paths on
storage tf.io.gfile reads, or `skimage:<name>` (a photo bundled with scikit-image).
Each is resized to the model's resolution and scaled to [-1, 1], as the official
checkpoints expect. Classes are named from the checkpoint (the ImageNet-1k names for
the registered ImageNet checkpoints, a Hugging Face config's labels) or
--class_names_file; otherwise by index.
"""

from __future__ import annotations

import json
import sys
from typing import List, Optional

from absl import flags

FLAGS = flags.FLAGS


def define_flags():
    flags.DEFINE_string("model", None, "Pretrained weights by name (see `python -m keras_vit.zoo "
                        "--pretrained`), a .keras file, an official .npz or a Hugging Face ViT directory.",
                        required=True)
    flags.DEFINE_integer("top_k", 5, "Classes shown per image.", lower_bound=1)
    flags.DEFINE_integer("image_size", None,
                         "Resolution for a checkpoint (position embeddings are interpolated); "
                         "default the checkpoint's.")
    flags.DEFINE_string("class_names_file", None,
                        "File with one class name per line (overrides the model's).")
    flags.DEFINE_integer("batch_size", 16, "Images per forward pass.", lower_bound=1)
    flags.DEFINE_bool("json", False, "Print one JSON document instead of a table.")


def top_k(probabilities, k: int, names: Optional[List[str]]) -> List[dict]:
    """The `k` most probable classes of one image: [{"index", "class", "probability"}]."""
    import numpy as np

    order = np.argsort(-probabilities, kind="stable")[:k]
    return [{"index": int(i), "class": names[i] if names else str(int(i)),
             "probability": float(probabilities[i])} for i in order]


def main(argv):
    images = argv[1:]
    from keras_vit import pretrained, storage
    from keras_vit.cli import exit_for_bad_config, load_model_or_exit
    from keras_vit.visualize.images import load_images

    if not images:
        exit_for_bad_config("no images given: python -m keras_vit.predict --model=... IMAGE [IMAGE ...]")
    model = load_model_or_exit(FLAGS.model, FLAGS.image_size)
    classes = model.config.num_classes
    if not classes:
        exit_for_bad_config(f"--model={FLAGS.model} has no classification head (num_classes=0): "
                            "it gives features, not classes")
    names = (storage.read_text(FLAGS.class_names_file).splitlines() if FLAGS.class_names_file
             else pretrained.class_names(FLAGS.model))
    if names is not None and len(names) != classes:
        exit_for_bad_config(f"{len(names)} class names for a model with {classes} classes")
    try:
        x, labels = load_images(images, model.config.image_size, model.config.num_channels, limit=None)
    except (FileNotFoundError, ValueError) as e:
        exit_for_bad_config(str(e))
    import keras

    print(f"Predicting {len(labels)} image(s) with {model.config.name} at "
          f"{model.config.image_size[0]}x{model.config.image_size[1]} ...", file=sys.stderr, flush=True)
    probabilities = keras.ops.convert_to_numpy(
        keras.ops.softmax(model.predict(x, batch_size=FLAGS.batch_size, verbose=0), axis=-1))
    results = [{"image": label, "top_k": top_k(p, FLAGS.top_k, names)}
               for label, p in zip(labels, probabilities)]
    if FLAGS.json:
        print(json.dumps({"model": FLAGS.model, "predictions": results}, indent=1))
        return
    for result in results:
        print(result["image"])
        for item in result["top_k"]:
            print(f"  {100 * item['probability']:6.2f}%  {item['class']}")


def run():
    from keras_vit.cli import run_app

    define_flags()
    run_app(main)


if __name__ == "__main__":
    run()
