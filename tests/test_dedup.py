"""pipeline.dedup on copies planted among real Fashion-MNIST images."""

import os

import numpy as np
import pytest

from keras_vit import fashion_mnist
from pipeline import dedup
from planting import KINDS, plant, png


@pytest.fixture(scope="module")
def planted():
    if not os.path.exists(os.path.join(fashion_mnist.DEFAULT_DIR, "t10k-images-idx3-ubyte.gz")):
        pytest.skip("dataset-fashion-mnist not installed (make test installs it)")
    train_x, _ = fashion_mnist.load_arrays("train", fashion_mnist.DEFAULT_DIR)
    test_x, _ = fashion_mnist.load_arrays("test", fashion_mnist.DEFAULT_DIR)
    rng = np.random.RandomState(0)
    # The measurement: 4,000 training and 1,000 test images, 100 copies of each kind.
    refs = test_x[rng.choice(len(test_x), 1000, replace=False)]
    distinct = train_x[rng.choice(len(train_x), 4000, replace=False)]
    train, truth = [png(a) for a in distinct], {}
    for k, kind in enumerate(KINDS):
        for j in range(k * 100, k * 100 + 100):
            truth[len(train)] = (kind, j)
            train.append(plant(refs[j], kind))
    return train, [png(a) for a in refs], truth, len(distinct)


def test_planted_copies_are_found_and_distinct_images_are_not(planted):
    train, refs, truth, num_distinct = planted
    found = dedup.find_near_duplicates(train, refs)
    pairs = {(i, j) for i, j, _ in found}
    for kind in KINDS:
        planted_pairs = [(i, j) for i, (k, j) in truth.items() if k == kind]
        recall = np.mean([p in pairs for p in planted_pairs])
        assert recall >= 0.98, f"{kind}: recall {recall:.2f}"
    flagged = {i for i, _, _ in found if i < num_distinct}
    assert len(flagged) / num_distinct <= 0.01, f"{len(flagged)} of {num_distinct} distinct images flagged"
    scores = {(i, j): s for i, j, s in found}
    assert all(scores[(i, j)] == 1.0 for i, (k, j) in truth.items() if k == "exact")
    assert all(s >= dedup.DEFAULT_THRESHOLD for s in scores.values())


def test_threshold_above_one_keeps_only_exact_copies(planted):
    train, refs, truth, _ = planted
    found = dedup.find_near_duplicates(train, refs, threshold=1.01)
    assert {truth[i][0] for i, _, _ in found if i in truth} == {"exact"}


def test_corrupt_bytes_name_the_record():
    good = png(np.zeros((8, 8), np.uint8))
    with pytest.raises(dedup.BadImageError, match=r"train image 1 \(7 bytes\) is not a JPEG"):
        dedup.find_near_duplicates([good, b"garbage"], [good])
    with pytest.raises(dedup.BadImageError, match="reference image 0"):
        dedup.find_near_duplicates([good], [b"\x89PNG\r\n\x1a\nbroken"])


def test_an_image_over_the_pixel_bound_or_cut_short_is_a_bad_record():
    import struct
    import zlib

    from keras_vit.preprocessing import DEFAULT_MAX_PIXELS

    good = png(np.zeros((8, 8), np.uint8))
    bomb = bytearray(good)
    bomb[16:24] = struct.pack(">II", 20000, 20000)  # IHDR: what the header declares
    bomb[29:33] = struct.pack(">I", zlib.crc32(bytes(bomb[12:29])))  # with its checksum right
    with pytest.raises(dedup.BadImageError, match=f"train record 7 is 20000x20000, over the "
                                                  f"{DEFAULT_MAX_PIXELS:,}-pixel limit"):
        dedup.pixel_hash(bytes(bomb), "train record 7")
    photo = png(np.random.RandomState(0).randint(0, 256, (64, 64, 3), np.uint8))
    with pytest.raises(dedup.BadImageError, match=r"train record 8 \(\d+ bytes, 64x64\) does not decode"):
        dedup.decode_gray(photo[:len(photo) // 2], "train record 8")


def test_dedup_decodes_as_serving_does_a_batch_at_a_time_within_its_pixel_budget(monkeypatch):
    import io

    import tensorflow as tf
    from PIL import Image

    from keras_vit import preprocessing

    rng = np.random.RandomState(1)
    images = []
    for i, (h, w) in enumerate([(30, 20), (8, 8), (17, 41), (64, 48)]):
        buf = io.BytesIO()
        Image.fromarray(rng.randint(0, 256, (h, w, 3), np.uint8)).save(buf, "JPEG" if i % 2 else "PNG")
        images.append(buf.getvalue())
    images.insert(2, images[1][:40])  # cut short: refused by name, its neighbours unharmed
    names = [f"r{i}" for i in range(len(images))]
    whole = dedup.decode_rgb(images, names)
    monkeypatch.setattr(dedup, "BATCH_PIXELS", 700)  # runs of one or two images
    assert len(dedup._chunks(images)) > 2
    for (a, pa), (b, pb), data, name in zip(whole, dedup.decode_rgb(images, names), images, names):
        assert pa == pb
        if pa:
            assert a is None and b is None and pa.startswith(name + " (40 bytes")
            continue
        served = preprocessing.decode_image(tf.constant(data)).numpy()
        np.testing.assert_array_equal(a, served)
        np.testing.assert_array_equal(b, served)


def test_empty_inputs_and_flat_images():
    assert dedup.find_near_duplicates([], []) == []
    flat = png(np.full((8, 8), 7, np.uint8))
    other_flat = png(np.full((8, 8), 200, np.uint8))
    # Flat images have no pattern to correlate: only an exact copy matches.
    assert dedup.find_near_duplicates([flat, other_flat], [flat]) == [(0, 0, 1.0)]


def test_score_is_the_best_crop_correlation():
    rng = np.random.RandomState(0)
    base = rng.randint(0, 255, (40, 40)).astype(np.float32)
    crop = base[2:-2, 2:-2]
    t = dedup.thumbnails(crop, (1.0,))[0]
    refs = dedup.thumbnails(base, dedup.CROPS)
    other = dedup.thumbnails(rng.randint(0, 255, (40, 40)).astype(np.float32), dedup.CROPS)
    got = dedup.scores(t, np.stack([refs, other]))
    assert got[0] == pytest.approx(np.max(refs @ t)) and got[1] == pytest.approx(np.max(other @ t))
    assert got[0] > 0.9 > got[1]
    assert np.argmax(refs @ t) != 0  # a crop of the reference fits better than the whole


def _hash(b):
    try:
        return dedup.pixel_hash(b)
    except dedup.BadImageError:
        return "undecodable"  # the Beam job is to name it


def _run_beam(train, refs, tmp_path, threshold=None):
    import apache_beam as beam

    from pipeline import dedup_beam

    out = str(tmp_path / "pairs")
    with beam.Pipeline() as p:
        t = p | "T" >> beam.Create([(f"t{i}", b, _hash(b)) for i, b in enumerate(train)])
        r = p | "R" >> beam.Create([(f"r{j}", b, _hash(b)) for j, b in enumerate(refs)])
        _ = ((t, r) | dedup_beam.FindDuplicates(threshold=threshold) | beam.Map(repr)
             | beam.io.WriteToText(out, num_shards=1))
    with open(out + "-00000-of-00001") as f:
        return [eval(line) for line in f]  # noqa: S307  (our own repr of tuples)


def test_beam_job_finds_the_same_pairs_as_the_in_memory_api(planted, tmp_path):
    train, refs, truth, num_distinct = planted
    skip = num_distinct - 500  # 500 distinct images and every planted copy keep the test short
    train = train[skip:]
    truth = {i - skip: v for i, v in truth.items()}
    expected = {(i, j): s for i, j, s in dedup.find_near_duplicates(train, refs)}
    got = {(int(t[1:]), int(r[1:])): (s, kind) for t, r, s, kind in _run_beam(train, refs, tmp_path)}
    assert got.keys() == expected.keys()
    assert all(abs(got[k][0] - expected[k]) < 1e-6 for k in got)
    exact = {k for k, (_, kind) in got.items() if kind == "exact"}
    assert exact == {(i, j) for i, (kind, j) in truth.items() if kind == "exact"}


def test_beam_job_names_a_corrupt_record(tmp_path):
    good = png(np.zeros((8, 8), np.uint8))
    with pytest.raises(Exception, match=r"train record t1 \(7 bytes\) is not a JPEG, PNG, GIF or BMP image"):
        _run_beam([good, b"garbage"], [good], tmp_path)


def test_band_operator_is_the_difference_of_gaussians():
    from scipy.ndimage import gaussian_filter

    t = np.random.RandomState(0).rand(dedup.THUMB, dedup.THUMB).astype(np.float32)
    want = (gaussian_filter(t, dedup.BAND[0], mode="nearest")
            - gaussian_filter(t, dedup.BAND[1], mode="nearest"))
    np.testing.assert_allclose(t.reshape(-1) @ dedup.band_operator(), want.reshape(-1), atol=1e-5)
    # Constant images have no band: a flat thumbnail normalises to zeros.
    assert np.abs(np.ones(dedup.THUMB ** 2, np.float32) @ dedup.band_operator()).max() < 1e-5
