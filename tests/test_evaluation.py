"""Top-k, the few-shot ridge classifier and the linear probe."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_vit
from keras_vit import evaluation


def test_topk_accuracy():
    logits = np.array([[0.1, 0.9, 0.0], [0.8, 0.05, 0.15], [0.2, 0.3, 0.5]])
    labels = np.array([1, 2, 0])
    assert evaluation.topk_accuracy(logits, labels, 1) == pytest.approx(1 / 3)
    assert evaluation.topk_accuracy(logits, labels, 2) == pytest.approx(2 / 3)
    assert evaluation.topk_accuracy(logits, labels, 5) == 1.0


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
