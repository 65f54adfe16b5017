"""Images/s of our ViTs against keras-hub's `ViTBackbone`, and against the machine's matmul peak.

    make bench                                   # installs the bench extra, then runs this
    python -m benchmarks.vit_throughput --mode=train --models=ViT-Ti/16 --batch_sizes=32

For every model, precision and batch size it times, in one process and with all their
calls interleaved, our model and keras-hub's of the same architecture under each XLA
setting, and prints for each setting images/s (of the fastest call), how much faster ours
ran (the median over rounds of the paired calls' ratio, with a 90% bootstrap interval:
`measure.speedup`), and achieved FLOP/s as a share of the `tf.matmul` peak measured in
the same run in that precision's compute dtype. The table at the end compares each model
at its best XLA setting: per round, each model's faster setting
(`measure.fastest_per_round`), paired as above.
Inference counts 2 x MACs per image, as our model executes them
(`keras_vit.flops.forward_macs(executed=True)`); a training step 6 x. Figures, never
assertions.
"""

from __future__ import annotations

import numpy as np
from absl import app, flags

from benchmarks import measure

FLAGS = flags.FLAGS
flags.DEFINE_enum("mode", "inference", ["inference", "train"], "Forward passes, or whole training steps.")
flags.DEFINE_list("models", ["ViT-Ti/16", "ViT-S/16", "ViT-B/16"], "Registered model names.")
flags.DEFINE_list("batch_sizes", ["1", "32"], "Batch sizes.")
flags.DEFINE_list("precisions", ["float32", "mixed_bfloat16"], "Keras dtype policies.")
flags.DEFINE_list("jit", ["false", "true"], "XLA settings to time.")
flags.DEFINE_integer("image_size", 224, "Resolution.")
flags.DEFINE_float("min_seconds", 2.0, "Time each model for at least this long.")
flags.DEFINE_integer("min_rounds", 10, "Calls of each model at least (a round calls each once).",
                     lower_bound=3)
flags.DEFINE_bool("keras_hub", True, "Also time keras-hub's ViTBackbone (needs `make bench`'s extra).")


def _build(kind, config, num_classes):
    import keras_vit

    if kind == "ours":
        return keras_vit.create_model(config, num_classes=num_classes)
    return measure.keras_hub_vit(config, num_classes)


def main(argv):
    del argv
    import keras

    from keras_vit import flops
    from keras_vit.configs import model_config

    kinds = ["ours", "keras-hub"] if FLAGS.keras_hub else ["ours"]
    print("Measuring the tf.matmul peak (2048 x 2048)...", flush=True)
    peak = measure.matmul_peak()
    print(", ".join(f"{k}: {v / 1e9:.0f} GFLOP/s" for k, v in peak.items()))
    flop_factor = 2 if FLAGS.mode == "inference" else 6
    num_classes = 0 if FLAGS.mode == "inference" else 1000
    header = ("| model | precision | batch | jit | ours img/s | keras-hub img/s "
              "| ours / keras-hub (90% interval) | ours % of peak |\n|---|---|---:|---|---:|---:|---:|---:|")
    jits = [j.lower() == "true" for j in FLAGS.jit]
    cases = [(kind, jit) for kind in kinds for jit in jits]
    rows, best = [], []
    for name in FLAGS.models:
        config = model_config(name).replace(image_size=FLAGS.image_size, num_classes=max(num_classes, 1))
        # What our model computes, not the architecture's count: the difference (7%
        # at 224 px) is its class-token-only last block, not a higher share of the peak.
        flops_per_image = flop_factor * flops.forward_macs(config, executed=True)
        for precision in FLAGS.precisions:
            compute = "bfloat16" if "bfloat16" in precision else "float32"
            for batch in (int(b) for b in FLAGS.batch_sizes):
                rng = np.random.RandomState(0)
                images = rng.uniform(-1, 1, (batch, *config.image_size, 3)).astype("float32")
                labels = rng.randint(0, 1000, batch)
                # One model per case, even for inference: a training case compiles its
                # model for its XLA setting and updates its weights.
                models = measure.fresh_models(
                    lambda: {case: _build(case[0], config, num_classes) for case in cases}, precision)
                times = measure.interleaved_times(
                    {case: measure.model_call(m, images, labels, FLAGS.mode, case[1])
                     for case, m in models.items()},
                    len(models) * FLAGS.min_seconds, FLAGS.min_rounds)
                del models
                for jit in jits:
                    ours = batch / times["ours", jit].min()
                    share = ours * flops_per_image / peak[compute]
                    versus = "- | -"
                    if FLAGS.keras_hub:
                        faster = measure.speedup(times["keras-hub", jit], times["ours", jit])
                        hub = batch / times["keras-hub", jit].min()
                        versus = f"{hub:.1f} | {measure.format_speedup(faster)}"
                    row = (f"| {name} | {precision} | {batch} | {'on' if jit else 'off'} | "
                           f"{ours:.1f} | {versus} | {100 * share:.0f}% |")
                    rows.append(row)
                    print(row, flush=True)
                if FLAGS.keras_hub:
                    bests = {kind: measure.fastest_per_round(*(times[kind, jit] for jit in jits))
                             for kind in kinds}
                    best.append(measure.best_row(name, precision, batch, bests["ours"], bests["keras-hub"],
                                                 flops_per_image, peak[compute]))
    keras.mixed_precision.set_global_policy("float32")
    print(f"\n{FLAGS.mode}, {FLAGS.image_size} px; peak: "
          + ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peak.items()))
    print(header)
    print("\n".join(rows))
    if FLAGS.keras_hub:
        print("\nEach at its best of jit on/off, round by round:")
        print(measure.BEST_HEADER)
        print("\n".join(best))


if __name__ == "__main__":
    app.run(main)
