"""Throughput of de-duplication and how it grows with the data, in-memory and as a Beam job.

    python benchmarks/dedup_throughput.py --sizes=10000,20000,50000,100000 --beam_workers=2

Training images are real Fashion-MNIST train images (past 60k, their mirror images);
the reference set is the 10k test set. For each size it prints the seconds and
images/s of `pipeline.dedup.find_near_duplicates` and of the Beam job the pipeline's
Dedup component runs (DirectRunner), the LSH candidates per training image, and
the pairs found. A candidate stage that grew with all pairs would show candidates
per image rising with the data; it should stay flat, and time grow linearly.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("sizes", ["10000", "20000", "50000", "100000"], "Training-set sizes.")
flags.DEFINE_integer("references", 10000, "Reference (test) images.")
flags.DEFINE_integer("beam_workers", 2, "DirectRunner processes for the Beam job; 0 skips it.")


def _png(a):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def candidates_per_image(train, refs, dedup):
    config = dedup.DedupConfig()
    t = np.stack([dedup.thumbnails(dedup.decode_gray(b), (1.0,), config.thumb)[0] for b in train])
    r = np.stack([dedup.thumbnails(dedup.decode_gray(b), config.crops, config.thumb) for b in refs])
    lsh = dedup.LSH(config, r[:, 0].mean(axis=0))
    m, c, d = r.shape
    buckets = dedup.reference_buckets(lsh.keys(r.reshape(m * c, d)).reshape(m, c, -1))
    return float(np.mean([len(x) for x in dedup.candidates(lsh.keys(t), buckets)]))


def run_beam(train, refs, workers, dedup):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline import dedup_beam

    out = os.path.join(tempfile.mkdtemp(prefix="dedup-bench-"), "pairs")
    mode = []
    if workers > 1:
        mode = ["--direct_running_mode=multi_processing", f"--direct_num_workers={workers}"]
    start = time.perf_counter()
    with beam.Pipeline(options=PipelineOptions(mode)) as p:
        t = p | "T" >> beam.Create([(str(i), b, dedup.pixel_hash(b)) for i, b in enumerate(train)])
        r = p | "R" >> beam.Create([(str(j), b, dedup.pixel_hash(b)) for j, b in enumerate(refs)])
        _ = (t, r) | dedup_beam.FindDuplicates() | beam.Map(repr) | beam.io.WriteToText(out)
    seconds = time.perf_counter() - start
    found = 0
    for name in os.listdir(os.path.dirname(out)):
        with open(os.path.join(os.path.dirname(out), name)) as f:
            found += sum(1 for _ in f)
    return seconds, found


def main(argv):
    del argv
    from keras_vit import fashion_mnist
    from pipeline import dedup

    train_x, _ = fashion_mnist.load_arrays("train")
    test_x, _ = fashion_mnist.load_arrays("test")
    pool = np.concatenate([train_x, train_x[:, :, ::-1]])
    refs = [_png(a) for a in test_x[:FLAGS.references]]
    print(f"{os.cpu_count()} CPUs; references: {len(refs)} Fashion-MNIST test images", flush=True)
    print(f"{'train':>7} {'cand/img':>9} {'memory s':>9} {'img/s':>7} {'pairs':>6} "
          f"{'beam s':>8} {'img/s':>7} {'pairs':>6}", flush=True)
    for size in [int(s) for s in FLAGS.sizes]:
        train = [_png(a) for a in pool[:size]]
        cand = candidates_per_image(train, refs, dedup)
        start = time.perf_counter()
        found = dedup.find_near_duplicates(train, refs)
        seconds = time.perf_counter() - start
        total = size + len(refs)
        line = f"{size:>7} {cand:>9.1f} {seconds:>9.1f} {total / seconds:>7.0f} {len(found):>6}"
        if FLAGS.beam_workers:
            print(line + "   (Beam running...)", end="\r", file=sys.stderr, flush=True)
            beam_s, beam_found = run_beam(train, refs, FLAGS.beam_workers, dedup)
            line += f" {beam_s:>8.1f} {total / beam_s:>7.0f} {beam_found:>6}"
        print(line, flush=True)


if __name__ == "__main__":
    app.run(main)
