"""Top-k, the few-shot ridge classifier and the linear probe."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import data, evaluation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_topk_accuracy():
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.05, 0.15], [0.2, 0.3, 0.5]])
    labels = np.array([1, 2, 0])
    assert evaluation.topk_accuracy(logits, labels, 1) == pytest.approx(1 / 3)
    assert evaluation.topk_accuracy(logits, labels, 2) == pytest.approx(2 / 3)
    assert evaluation.topk_accuracy(logits, labels, 5) == 1.0


def test_topk_accuracy_refuses_what_it_would_misread():
    logits = np.zeros((3, 4))
    with pytest.raises(ValueError, match="k must be >= 1"):
        evaluation.topk_accuracy(logits, [0, 1, 2], 0)
    with pytest.raises(ValueError, match="2 labels for 3 rows"):
        evaluation.topk_accuracy(logits, [0, 1], 1)
    with pytest.raises(ValueError, match="integer class ids"):
        evaluation.topk_accuracy(logits, [0.5, 1, 2], 1)
    with pytest.raises(ValueError, match="logits must be"):
        evaluation.topk_accuracy(np.zeros((0, 4)), [], 1)


def test_ridge_matches_the_closed_form_in_both_primal_and_dual():
    rng = np.random.RandomState(0)
    for n, d in ((50, 8), (6, 20)):
        x, y = rng.normal(size=(n, d)), rng.randint(0, 3, n)
        clf = evaluation.RidgeClassifier(l2_reg=4.0).fit(x, y, 3)
        a = (x - x.mean(0)) / (x.std(0) + 1e-5)
        a = np.concatenate([a, np.full((n, 1), 100.0)], 1)
        w = np.linalg.inv(a.T @ a + 4.0 * np.eye(d + 1)) @ a.T @ (2 * np.eye(3)[y] - 1)
        np.testing.assert_allclose(clf.weights, w, atol=1e-6)


def test_fewshot_separable_features_are_solved_and_shots_are_balanced():
    rng = np.random.RandomState(1)
    centres = rng.normal(size=(4, 16)) * 4
    train_y, test_y = np.repeat(np.arange(4), 30), np.repeat(np.arange(4), 10)
    train_x = centres[train_y] + rng.normal(size=(120, 16)) * 0.5
    test_x = centres[test_y] + rng.normal(size=(40, 16)) * 0.5
    result = evaluation.fewshot_accuracy(train_x, train_y, test_x, test_y, shots=(1, 5, 25), seeds=(0, 1, 2))
    assert set(result) == {1, 5, 25}
    assert result[25][0] == 1.0 and result[5][0] >= 0.95
    idx = evaluation.sample_shots(train_y, 5, seed=3)
    assert np.bincount(train_y[idx]).tolist() == [5, 5, 5, 5]
    with pytest.raises(ValueError, match="fewer than 40 shots"):
        evaluation.sample_shots(train_y, 40, seed=0)
    noise = evaluation.fewshot_accuracy(rng.normal(size=(120, 16)), train_y,
                                        rng.normal(size=(40, 16)), test_y, shots=(5,))
    assert noise[5][0] < 0.6


def test_features_are_the_frozen_pre_logits():
    model = keras_vit.create_model(keras_vit.ViTConfig(name="t", patch_size=4, hidden_size=16, mlp_dim=32,
                                                       num_heads=2, num_layers=1, image_size=(8, 8),
                                                       num_classes=2, representation_size=8))
    x = np.random.RandomState(0).uniform(-1, 1, (40, 8, 8, 3)).astype("float32")
    y = np.arange(40) % 2
    feats, labels = evaluation.extract_features(model, tf.data.Dataset.from_tensor_slices((x, y)).batch(16))
    assert feats.shape == (40, 8)
    np.testing.assert_array_equal(labels, y)
    np.testing.assert_allclose(feats, model.forward(x)["pre_logits"], atol=1e-5)


def test_features_come_from_a_traced_graph_not_op_by_op():
    eager = []

    def record(t):
        eager.append(tf.executing_eagerly())
        return t

    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(record), keras.layers.Dense(3)])
    eager.clear()  # building the model called the layer symbolically
    x = np.zeros((10, 4), "float32")
    feats, _ = evaluation.extract_features(model, tf.data.Dataset.from_tensor_slices((x, x[:, 0])).batch(4))
    assert feats.shape == (10, 3) and eager and not any(eager)


def test_linear_probe_separates_what_is_separable_and_not_noise():
    rng = np.random.RandomState(2)
    y = np.arange(200) % 3
    centres = rng.normal(size=(3, 10)) * 3
    x = centres[y] + rng.normal(size=(200, 10))
    assert evaluation.linear_probe(x[:150], y[:150], x[150:], y[150:]) >= 0.95
    noise = rng.normal(size=(200, 10))
    assert evaluation.linear_probe(noise[:150], y[:150], noise[150:], y[150:]) < 0.6


def separable(rng, n_train=30, n_test=10, classes=4, dims=16):
    centres = rng.normal(size=(classes, dims)) * 4
    train_y, test_y = np.repeat(np.arange(classes), n_train), np.repeat(np.arange(classes), n_test)
    return (centres[train_y] + rng.normal(size=(len(train_y), dims)) * 0.5, train_y,
            centres[test_y] + rng.normal(size=(len(test_y), dims)) * 0.5, test_y)


def test_fewshot_on_features_of_the_drawn_examples_alone_matches_all_features():
    train_x, train_y, test_x, test_y = separable(np.random.RandomState(3))
    draws = evaluation.fewshot_draws(train_y, (1, 5), (0, 1))
    assert sorted(draws) == [(1, 0), (1, 1), (5, 0), (5, 1)]
    needed = np.unique(np.concatenate(list(draws.values())))
    assert len(needed) < len(train_y)
    asked = []

    def lookup(idx):
        asked.append(idx)
        return train_x[needed][np.searchsorted(needed, idx)]

    full = evaluation.fewshot_accuracy(train_x, train_y, test_x, test_y, shots=(1, 5), seeds=(0, 1))
    assert evaluation.fewshot_accuracy(lookup, train_y, test_x, test_y, shots=(1, 5), seeds=(0, 1)) == full
    assert all(np.isin(idx, needed).all() for idx in asked) and len(asked) == 4


def test_fewshot_refuses_bad_input_by_name():
    train_x, train_y, test_x, test_y = separable(np.random.RandomState(4))
    cases = [
        (dict(shots=(0,)), "shots must be >= 1"),
        (dict(seeds=()), "at least one shot count and one seed"),
        (dict(train_y=train_y[:-1]), "train_x has 120 rows for 119 labels"),
        (dict(test_x=test_x[:, :8]), "train features have 16 dimensions, test features 8"),
        (dict(train_y=np.where(train_y == 3, -1, train_y)), "train_y holds a negative class id"),
        (dict(test_y=test_y + 0.5), "test_y must hold integer class ids"),
        (dict(num_classes=3), "train_y holds class id 3, outside \\[0, 3\\)"),
        (dict(test_x=np.where(test_x > 5, np.nan, test_x)), "test_x holds NaN or inf"),
        (dict(train_x=lambda idx: train_x[idx][:, :4]), "train features have 4 dimensions"),
    ]
    for change, message in cases:
        args = dict(train_x=train_x, train_y=train_y, test_x=test_x, test_y=test_y, shots=(1,), seeds=(0,))
        args.update(change)
        with pytest.raises(ValueError, match=message):
            evaluation.fewshot_accuracy(**args)


def test_a_test_class_without_training_examples_counts_as_wrong():
    train_x, train_y, test_x, test_y = separable(np.random.RandomState(5))
    seen = train_y != 3
    result = evaluation.fewshot_accuracy(train_x[seen], train_y[seen], test_x, test_y, shots=(5,))
    assert result[5][0] == pytest.approx(0.75)


def tiny_model(image_size=8):
    return keras_vit.create_model(keras_vit.ViTConfig(name="t", patch_size=4, hidden_size=16, mlp_dim=32,
                                                      num_heads=2, num_layers=1, num_classes=10,
                                                      image_size=(image_size, image_size)))


def test_a_plan_extracts_only_the_drawn_images_and_scores_as_all_features_would(fake_fmnist):
    source = data.open_source("fashion_mnist_local", data_dir=fake_fmnist)
    model, logs = tiny_model(), []
    plan = evaluation.FewShotPlan(source, "train", "test", shots=[1, 3], seeds=2)
    result = plan.run(model, log=logs.append)
    draws = evaluation.fewshot_draws(data.labels(source, "train"), [1, 3], range(2))
    drawn = len(np.unique(np.concatenate(list(draws.values()))))
    assert drawn < 96 and f"Features of {drawn} train images (the shots' draws) and 48 test" in logs[0]

    def everything(split):
        ds = data.make_dataset(source, split, image_size=8, batch_size=64, training=False)
        return evaluation.extract_features(model, ds)

    train_x, train_y = everything("train")
    np.testing.assert_array_equal(train_y, data.labels(source, "train"))
    test_x, test_y = everything("test")
    expected = evaluation.fewshot_accuracy(train_x, train_y, test_x, test_y, shots=[1, 3], seeds=range(2))
    assert sorted(result["fewshot"]) == [1, 3]
    for k, (mean, std) in expected.items():
        assert (result["fewshot"][k]["mean"], result["fewshot"][k]["std"]) == pytest.approx((mean, std))
    assert result["test_examples"] == 48 and result["linear_probe"] is None

    probed = evaluation.FewShotPlan(source, "train", "test", shots=[1], seeds=1, test_examples=20,
                                    linear_probe_examples=40).run(model, log=logs.append)
    assert probed["test_examples"] == 20 and probed["linear_probe_examples"] == 40
    assert 0.0 <= probed["linear_probe"] <= 1.0 and "and the probe" in logs[-1]


def test_a_plan_warns_of_test_classes_it_has_no_shots_of(tmp_path):
    from PIL import Image

    rng = np.random.RandomState(0)
    for split, label, n in (("train", "cat", 3), ("train", "dog", 3), ("test", "cat", 2), ("test", "fox", 2)):
        folder = tmp_path / split / label
        folder.mkdir(parents=True)
        for i in range(n):
            Image.fromarray(rng.randint(0, 255, (8, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    source = data.open_source(image_dir=str(tmp_path))
    logs = []
    plan = evaluation.FewShotPlan(source, "train", "test", shots=[1], seeds=1)
    result = plan.run(tiny_model(), log=logs.append)
    assert "Warning: test holds classes with no train examples, scored as wrong: ['fox']" in logs
    assert result["fewshot"][1]["mean"] <= 0.5  # the two fox images can only be wrong


def test_examples_selects_records_by_position_for_evaluation_only(fake_fmnist):
    source = data.open_source("fashion_mnist_local", data_dir=fake_fmnist)
    whole = next(iter(data.make_dataset(source, "test", image_size=8, batch_size=48, training=False)))
    picked = [40, 3, 17, 3]
    ds = data.make_dataset(source, "test", image_size=8, batch_size=48, training=False, examples=picked)
    assert int(ds.cardinality()) == 1
    images, labels = next(iter(ds))
    np.testing.assert_array_equal(images.numpy(), whole[0].numpy()[[3, 17, 40]])
    np.testing.assert_array_equal(labels.numpy(), whole[1].numpy()[[3, 17, 40]])
    with pytest.raises(ValueError, match=r"positions in \[0, 48\)"):
        data.make_dataset(source, "test", image_size=8, batch_size=8, training=False, examples=[48])
    with pytest.raises(ValueError, match="training reads the whole split"):
        data.make_dataset(source, "train", image_size=8, batch_size=8, training=True, examples=[1])


def test_the_command_line_reports_where_its_results_went_and_refuses_too_many_shots(fake_fmnist, tmp_path):
    model_path = str(tmp_path / "tiny.keras")
    tiny_model(image_size=12).save(model_path)
    env = {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"}
    base = [sys.executable, "-m", "keras_vit.evaluate", f"--model={model_path}",
            f"--data_dir={fake_fmnist}", "--precision=float32"]
    out = str(tmp_path / "reports" / "fewshot.json")
    ok = subprocess.run(base + ["--shots=1,2", "--seeds=2", "--linear_probe_examples=30",
                                f"--output_json={out}"], env=env, capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr[-3000:]
    result = json.loads(open(out).read())
    assert sorted(result["fewshot"]) == ["1", "2"] and result["precision"] == "float32"
    assert f"Results: {out}" in ok.stdout and "2-shot: " in ok.stdout
    assert "linear probe (30 images)" in ok.stdout
    assert "batches" in ok.stderr  # progress
    bad = subprocess.run(base + ["--shots=20"], env=env, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "has 10 examples, fewer than 20 shots" in bad.stderr
