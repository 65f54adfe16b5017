"""Evaluation: top-k accuracy, a linear probe, and few-shot linear evaluation as big_vision does it.

Few-shot: features are standardised with the statistics of the shots, a constant
feature of 100 is appended (a bias that the l2 penalty barely touches), and a
ridge regression to {-1, 1} one-hot targets is solved in closed form with
l2 = 2^10; the predicted class is the argmax. Accuracies are averaged over seeds.
"""

from __future__ import annotations

from typing import Dict, Iterable, Sequence, Tuple

import numpy as np

BIAS_FEATURE = 100.0
DEFAULT_L2 = 2.0 ** 10


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int = 1) -> float:
    """Fraction of rows whose label is among the k largest logits. `[N, C]`, `[N]`."""
    logits, labels = np.asarray(logits), np.asarray(labels).reshape(-1)
    k = min(k, logits.shape[-1])
    top = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
    return float(np.mean(np.any(top == labels[:, None], axis=-1)))


def extract_features(model, dataset) -> Tuple[np.ndarray, np.ndarray]:
    """Frozen pre-logits features `[N, R or D]` and labels `[N]` of a `(images, labels)` dataset."""
    extractor = model.feature_extractor() if hasattr(model, "feature_extractor") else model
    feats, labels = [], []
    for images, y in dataset:
        # predict_on_batch runs a traced graph; a plain call ran op by op, 3.6x slower for
        # ViT-Ti/16 at batch 32.
        feats.append(np.asarray(extractor.predict_on_batch(images), dtype=np.float64))
        labels.append(np.asarray(y).reshape(-1))
    return np.concatenate(feats), np.concatenate(labels)


class RidgeClassifier:
    """Closed-form ridge regression to {-1, 1} one-hot targets on standardised features."""

    def __init__(self, l2_reg: float = DEFAULT_L2):
        self.l2_reg = float(l2_reg)

    def _prepare(self, x):
        x = (np.asarray(x, np.float64) - self.mean) / self.std
        return np.concatenate([x, np.full((len(x), 1), BIAS_FEATURE)], axis=1)

    def fit(self, x: np.ndarray, y: np.ndarray, num_classes: int) -> "RidgeClassifier":
        x = np.asarray(x, np.float64)
        self.mean = x.mean(axis=0, keepdims=True)
        self.std = x.std(axis=0, keepdims=True) + 1e-5
        a = self._prepare(x)
        targets = 2.0 * np.eye(num_classes)[np.asarray(y).reshape(-1)] - 1.0
        n, d = a.shape
        if n >= d:
            self.weights = np.linalg.solve(a.T @ a + self.l2_reg * np.eye(d), a.T @ targets)
        else:  # the dual form is the smaller system when there are fewer shots than features
            self.weights = a.T @ np.linalg.solve(a @ a.T + self.l2_reg * np.eye(n), targets)
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(self._prepare(x) @ self.weights, axis=-1)

    def accuracy(self, x, y) -> float:
        return float(np.mean(self.predict(x) == np.asarray(y).reshape(-1)))


def sample_shots(labels: np.ndarray, shots: int, seed: int) -> np.ndarray:
    """Indices of `shots` examples per class, drawn without replacement."""
    rng = np.random.RandomState(seed)
    picks = []
    for c in np.unique(labels):
        where = np.flatnonzero(labels == c)
        if len(where) < shots:
            raise ValueError(f"class {c} has {len(where)} examples, fewer than {shots} shots")
        picks.append(rng.choice(where, shots, replace=False))
    return np.concatenate(picks)


def fewshot_accuracy(train_x, train_y, test_x, test_y, shots: Iterable[int] = (1, 5, 10, 25),
                     seeds: Sequence[int] = (0, 1, 2), l2_reg: float = DEFAULT_L2,
                     num_classes: int = None) -> Dict[int, Tuple[float, float]]:
    """{shots: (mean accuracy, std over seeds)} of the ridge classifier on test features."""
    train_y = np.asarray(train_y).reshape(-1)
    num_classes = num_classes or int(max(train_y.max(), np.max(test_y)) + 1)
    out = {}
    for k in shots:
        accs = []
        for seed in seeds:
            idx = sample_shots(train_y, k, seed)
            clf = RidgeClassifier(l2_reg).fit(train_x[idx], train_y[idx], num_classes)
            accs.append(clf.accuracy(test_x, test_y))
        out[int(k)] = (float(np.mean(accs)), float(np.std(accs)))
    return out


def linear_probe(train_x, train_y, test_x, test_y, c: float = 1.0, max_iter: int = 1000) -> float:
    """Test accuracy of a multinomial logistic regression on frozen, standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
    clf.fit(train_x, np.asarray(train_y).reshape(-1))
    return float(clf.score(test_x, np.asarray(test_y).reshape(-1)))
