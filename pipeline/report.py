"""The Dedup component's report: counts, the pairs, and a contact sheet to review.

`report.json`: threshold, training images before and after, removed per reference
split, pairs per split and kind, and every pair with its score, best first.
`pairs.csv`: the same pairs as a table. `contact_sheet.png`: the closest pairs, the
training image beside the evaluation image it copies.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections import Counter, defaultdict
from typing import Dict, List

import tensorflow as tf

from pipeline import dedup, ingest

CELL = 84  # pixels per image on the sheet


def read_pairs(prefix: str) -> List[dict]:
    pairs = []
    for path in sorted(tf.io.gfile.glob(prefix + "*")):
        with tf.io.gfile.GFile(path) as f:
            for line in f:
                if line.strip():
                    train_id, ref, score, kind = json.loads(line)
                    split, ref_id = ref.split(":", 1)
                    pairs.append({"train_id": train_id, "reference_split": split, "reference_id": ref_id,
                                  "score": score, "kind": kind})
    pairs.sort(key=lambda x: (-x["score"], x["train_id"], x["reference_split"], x["reference_id"]))
    return pairs


def summarise(pairs: List[dict], references: List[str], train_count=None, threshold=None) -> dict:
    removed: Dict[str, set] = {s: set() for s in references}
    kinds: Dict[str, Counter] = {s: Counter() for s in references}
    for x in pairs:
        removed[x["reference_split"]].add(x["train_id"])
        kinds[x["reference_split"]][x["kind"]] += 1
    total = len({x["train_id"] for x in pairs})
    return {
        "threshold": threshold,
        "train_before": train_count,
        "train_after": None if train_count is None else train_count - total,
        "removed_total": total,
        "removed_by_split": {s: len(v) for s, v in removed.items()},
        "pairs_by_split_and_kind": {s: {"exact": c["exact"], "near": c["near"]} for s, c in kinds.items()},
        "pairs": pairs,
    }


def _images_by_id(examples_uri: str, wanted: Dict[str, set]) -> Dict[tuple, bytes]:
    found = {}
    spec = {ingest.IMAGE: tf.io.FixedLenFeature([], tf.string),
            ingest.SOURCE_ID: tf.io.FixedLenFeature([], tf.string)}
    for split, ids in wanted.items():
        if not ids:
            continue
        files = tf.io.gfile.glob(os.path.join(examples_uri, f"Split-{split}", "*"))
        ds = tf.data.TFRecordDataset(files, compression_type="GZIP").map(
            lambda r: tf.io.parse_single_example(r, spec))
        for ex in ds.as_numpy_iterator():
            sid = ex[ingest.SOURCE_ID].decode()
            if sid in ids:
                found[(split, sid)] = ex[ingest.IMAGE]
    return found


def contact_sheet(pairs: List[dict], images: Dict[tuple, bytes]) -> bytes:
    """PNG: one row per pair, training image | reference image | score and kind."""
    from PIL import Image, ImageDraw

    text_w = 220
    sheet = Image.new("RGB", (2 * CELL + text_w, max(len(pairs), 1) * CELL), "white")
    draw = ImageDraw.Draw(sheet)
    if not pairs:
        draw.text((8, 8), "no duplicates found", fill="black")
    keys = [k for x in pairs for k in (("train", x["train_id"]), (x["reference_split"], x["reference_id"]))
            if k in images]
    names = [f"{split} record {i}" for split, i in keys]
    decoded = dict(zip(keys, dedup.decode_rgb([images[k] for k in keys], names)))
    for row, x in enumerate(pairs):
        for col, key in enumerate((("train", x["train_id"]), (x["reference_split"], x["reference_id"]))):
            rgb, _ = decoded.get(key, (None, ""))
            if rgb is not None:
                sheet.paste(Image.fromarray(rgb).resize((CELL - 4, CELL - 4)),
                            (col * CELL + 2, row * CELL + 2))
        draw.text((2 * CELL + 8, row * CELL + 8),
                  f"{x['kind']}  {x['score']:.4f}\ntrain {x['train_id'][-28:]}\n"
                  f"{x['reference_split']} {x['reference_id'][-28:]}", fill="black")
    out = io.BytesIO()
    sheet.save(out, "PNG")
    return out.getvalue()


def write_report(uri: str, pairs_prefix: str, examples_uri: str, references: List[str], train_count=None,
                 threshold=None, sheet_pairs: int = 24) -> dict:
    """Writes report.json, pairs.csv and contact_sheet.png into `uri`; returns the summary."""
    pairs = read_pairs(pairs_prefix)
    summary = summarise(pairs, references, train_count, threshold)
    with tf.io.gfile.GFile(os.path.join(uri, "report.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with tf.io.gfile.GFile(os.path.join(uri, "pairs.csv"), "w") as f:
        writer = csv.DictWriter(f, ["train_id", "reference_split", "reference_id", "score", "kind"])
        writer.writeheader()
        writer.writerows(pairs)
    shown = pairs[:sheet_pairs]
    wanted = defaultdict(set)
    for x in shown:
        wanted["train"].add(x["train_id"])
        wanted[x["reference_split"]].add(x["reference_id"])
    with tf.io.gfile.GFile(os.path.join(uri, "contact_sheet.png"), "wb") as f:
        f.write(contact_sheet(shown, _images_by_id(examples_uri, wanted)))
    for path in tf.io.gfile.glob(pairs_prefix + "*"):
        tf.io.gfile.remove(path)
    return summary
