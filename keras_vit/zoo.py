"""Builds every registered model and writes its size and cost: `python -m keras_vit.zoo`.

For each model: parameters (counted on the built Keras model), forward GMACs and
the token count at the chosen resolution. Writes `model_zoo.md` and
`model_zoo.json` into --output_dir.

`python -m keras_vit.zoo --pretrained [--pattern='vit_base*']` prints the named
pretrained checkpoints instead (`keras_vit.list_pretrained`).
"""

from __future__ import annotations

import json
import sys
import time

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_list("models", None, "Model names to include (default: all registered).")
flags.DEFINE_integer("image_size", 224, "Square input resolution.")
flags.DEFINE_integer("num_classes", 1000, "Head size.")
flags.DEFINE_string("output_dir", "saved_models/zoo", "Where model_zoo.md and model_zoo.json go.")
flags.DEFINE_bool("pretrained", False, "Print the named pretrained checkpoints and exit.")
flags.DEFINE_string("pattern", None, "With --pretrained: only names matching this fnmatch pattern.")


def describe(name: str, image_size: int, num_classes: int) -> dict:
    import keras

    import keras_vit
    from keras_vit.flops import forward_macs

    model = keras_vit.create_model(name, num_classes=num_classes, image_size=image_size)
    cfg = model.config
    row = {
        "model": cfg.name,
        "params": int(model.count_params()),
        "gmacs": round(forward_macs(cfg) / 1e9, 3),
        "tokens": cfg.seq_len,
        "hidden_size": cfg.hidden_size,
        "layers": cfg.num_layers,
        "heads": cfg.num_heads,
    }
    del model
    policy = keras.mixed_precision.global_policy()
    keras.backend.clear_session()
    keras.mixed_precision.set_global_policy(policy)  # clear_session resets it to float32
    return row


def main(argv):
    del argv
    import keras_vit

    if FLAGS.pretrained:
        from keras_vit import pretrained

        entries = pretrained.list_pretrained(FLAGS.pattern)
        if not entries:
            sys.exit(f"no pretrained checkpoint matches {FLAGS.pattern!r}")
        print(pretrained.describe(entries))
        print(f"{len(entries)} checkpoints; files cached in {pretrained.cache_dir()}", file=sys.stderr)
        return

    names = FLAGS.models or keras_vit.list_models()
    rows = []
    for i, name in enumerate(names, 1):
        start = time.time()
        rows.append(describe(name, FLAGS.image_size, FLAGS.num_classes))
        r = rows[-1]
        print(f"[{i}/{len(names)}] {r['model']:<14} {r['params']:>13,} params  {r['gmacs']:>8.2f} GMACs"
              f"  ({time.time() - start:.1f} s)", flush=True)
    from keras_vit import storage

    table = [f"Models at {FLAGS.image_size}x{FLAGS.image_size}, {FLAGS.num_classes} classes.\n\n",
             "| model | params | GMACs | tokens | width | depth | heads |\n",
             "|---|---:|---:|---:|---:|---:|---:|\n"]
    table += [f"| {r['model']} | {r['params']:,} | {r['gmacs']:.2f} | {r['tokens']} | "
              f"{r['hidden_size']} | {r['layers']} | {r['heads']} |\n" for r in rows]
    md = storage.write_text(storage.join(FLAGS.output_dir, "model_zoo.md"), "".join(table))
    js = storage.write_text(storage.join(FLAGS.output_dir, "model_zoo.json"), json.dumps(rows, indent=2))
    print(f"Wrote {md} and {js}", file=sys.stderr)


def run():
    from keras_vit.cli import run_app

    run_app(main)


if __name__ == "__main__":
    run()
