"""The de-duplication of `pipeline.dedup` as a Beam job, for data that outgrows one process.

Stages (the same functions as the in-memory API, so both find the same pairs):
  1. thumbnails per record (batches of records, in parallel);
  2. exact copies: training and reference records joined on their pixel hash;
  3. candidates: LSH bucket keys, one per table (per crop for references), joined on
     equal keys; a training image's candidates are the references of its buckets.
     This grows about linearly with the data, unlike all pairs;
  4. verification of each training image against its candidates by crop-aware
     correlation. The reference thumbnails are a side input: the evaluation sets are
     small next to the training data (10k references take 92 MB).
"""

from __future__ import annotations

from typing import Tuple

import apache_beam as beam
import numpy as np

from pipeline import dedup


class _MeanVector(beam.CombineFn):
    def create_accumulator(self):
        return (0.0, 0)

    def add_input(self, acc, v):
        return (acc[0] + v.astype(np.float64), acc[1] + 1)

    def merge_accumulators(self, accs):
        total, n = 0.0, 0
        for t, c in accs:
            total, n = total + t, n + c
        return (total, n)

    def extract_output(self, acc):
        return None if acc[1] == 0 else (acc[0] / acc[1]).astype(np.float32)


def _thumbs(records, crops, config, kind):
    # A batch at a time: the decoder's per-call cost is ten times its per-image cost.
    decoded = dedup.decode_rgb([r[1] for r in records], [f"{kind} record {r[0]}" for r in records])
    for (record_id, _, pixel_hash), (rgb, problem) in zip(records, decoded):
        if problem:
            raise dedup.BadImageError(problem)
        yield record_id, dedup.thumbnails(dedup.luma(rgb), crops, config.thumb, config.band), pixel_hash


def _thumbnails(pcoll, crops, config, kind, label):
    return (pcoll | f"{label}Batches" >> beam.BatchElements(min_batch_size=8, max_batch_size=256)
            | f"{label}Thumbs" >> beam.FlatMap(_thumbs, crops, config, kind))


_LSH_CACHE = {}


def _lsh(config, centre):
    # The planes take ~5 ms to draw: build them once per worker, not per record.
    key = (config, centre.tobytes())
    if key not in _LSH_CACHE:
        _LSH_CACHE.clear()
        _LSH_CACHE[key] = dedup.LSH(config, centre)
    return _LSH_CACHE[key]


def _keys(record, centre, config, kind):
    record_id, thumbs, _ = record
    if centre is None:
        return
    keys = _lsh(config, centre).keys(thumbs)  # [crops, T]
    for t in range(keys.shape[1]):
        for k in set(keys[:, t].tolist()):
            yield (t, k), (kind, record_id)


def _bucket_candidates(item):
    _, members = item
    refs = [rid for kind, rid in members if kind == "r"]
    if refs:
        for kind, rid in members:
            if kind == "t":
                yield rid, refs


def _verify(item, ref_thumbs, threshold):
    train_id, joined = item
    thumbs = joined["thumb"]
    if not thumbs or not joined["cand"]:
        return
    refs = sorted(set().union(*joined["cand"]))
    got = dedup.scores(thumbs[0][0], np.stack([ref_thumbs[r] for r in refs]))
    for ref_id, s in zip(refs, got.tolist()):
        if s >= threshold:
            yield (train_id, ref_id), (0, round(float(s), 6))


def _exact(item):
    _, joined = item
    for t in joined["train"]:
        for r in joined["ref"]:
            yield (t, r), (1, 1.0)


@beam.ptransform_fn
@beam.typehints.with_input_types(Tuple[beam.PCollection, beam.PCollection])
def FindDuplicates(pcolls, threshold=None, config: dedup.DedupConfig = dedup.DedupConfig()):  # noqa: N802
    """(train, reference) PCollections of `(record_id, image_bytes, pixel_hash)` ->
    PCollection of `(train_id, reference_id, score, kind)`; kind is "exact" (same
    decoded pixels, score 1.0) or "near"."""
    train, refs = pcolls
    threshold = config.threshold if threshold is None else float(threshold)
    train_t = _thumbnails(train, (1.0,), config, "train", "Train")
    ref_t = _thumbnails(refs, config.crops, config, "reference", "Ref")

    exact = ({"train": train | "TrainByHash" >> beam.Map(lambda r: (r[2], r[0])),
              "ref": refs | "RefByHash" >> beam.Map(lambda r: (r[2], r[0]))}
             | "JoinHash" >> beam.CoGroupByKey() | "ExactPairs" >> beam.FlatMap(_exact))

    centre = beam.pvalue.AsSingleton(
        ref_t | "Whole" >> beam.Map(lambda r: r[1][0]) | "Centre" >> beam.CombineGlobally(_MeanVector()))
    keys = ((train_t | "TrainKeys" >> beam.FlatMap(_keys, centre, config, "t"),
             ref_t | "RefKeys" >> beam.FlatMap(_keys, centre, config, "r"))
            | "AllKeys" >> beam.Flatten())
    cands = (keys | "Buckets" >> beam.GroupByKey()
             | "BucketCandidates" >> beam.FlatMap(_bucket_candidates))
    near = ({"cand": cands, "thumb": train_t | "ThumbById" >> beam.Map(lambda r: (r[0], r[1]))}
            | "JoinCandidates" >> beam.CoGroupByKey()
            | "Verify" >> beam.FlatMap(
                _verify, beam.pvalue.AsDict(ref_t | "RefById" >> beam.Map(lambda r: (r[0], r[1]))),
                threshold))
    return ((exact, near) | "AllPairs" >> beam.Flatten()
            | "BestScore" >> beam.CombinePerKey(max)  # an exact match outranks a near one
            | "Flat" >> beam.Map(lambda kv: (kv[0][0], kv[0][1], kv[1][1], "exact" if kv[1][0] else "near")))
