"""Throughput of pipeline.dedup.find_near_duplicates and how it grows with the data.

    python benchmarks/dedup_throughput.py --sizes=10000,20000,50000,100000

Training images are real Fashion-MNIST train images (past 60k, their mirror images);
the reference set is the 10k test set. Prints images/s, candidate pairs per training
image and pairs found, per size. A stage that grew with all pairs would show the
candidates per image rising in proportion to the reference set; it should stay flat.
"""

from __future__ import annotations

import io
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["10000", "20000", "50000", "100000"], "Training-set sizes.")
flags.DEFINE_integer("references", 10000, "Reference (test) images.")


def _png(a):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def main(argv):
    del argv
    from keras_vit import fashion_mnist
    from pipeline import dedup

    train_x, _ = fashion_mnist.load_arrays("train")
    test_x, _ = fashion_mnist.load_arrays("test")
    pool = np.concatenate([train_x, train_x[:, :, ::-1]])
    refs = [_png(a) for a in test_x[:FLAGS.references]]
    print(f"{'train':>7} {'refs':>6} {'seconds':>8} {'images/s':>9} {'cand/img':>9} {'pairs':>6}", flush=True)
    original = dedup.candidate_pairs
    for size in [int(s) for s in FLAGS.sizes]:
        train = [_png(a) for a in pool[:size]]
        counted = {}

        def counting(train_keys, ref_keys):
            pairs = original(train_keys, ref_keys)
            counted["n"] = len(pairs)
            return pairs

        dedup.candidate_pairs = counting
        start = time.perf_counter()
        found = dedup.find_near_duplicates(train, refs)
        seconds = time.perf_counter() - start
        dedup.candidate_pairs = original
        total = size + len(refs)
        print(f"{size:>7} {len(refs):>6} {seconds:>8.1f} {total / seconds:>9.0f} "
              f"{counted['n'] / size:>9.2f} {len(found):>6}", flush=True)


if __name__ == "__main__":
    app.run(main)
