"""Evaluation: top-k accuracy, a linear probe, and few-shot linear evaluation as big_vision does it.

Few-shot: features are standardised with the statistics of the shots, a constant
feature of 100 is appended (a bias that the l2 penalty barely touches), and a
ridge regression to {-1, 1} one-hot targets is solved in closed form with
l2 = 2^10; the predicted class is the argmax. Accuracies are averaged over seeds.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Dict, Iterable, Optional, Sequence, Tuple, Union

import numpy as np

from keras_vit import extras

BIAS_FEATURE = 100.0
DEFAULT_L2 = 2.0 ** 10


def _labels(y, name: str, num_classes: Optional[int] = None) -> np.ndarray:
    """`y` as int64 `[N]`, refusing what np.eye would silently misread (floats, -1)."""
    y = np.asarray(y)
    if y.dtype.kind not in "iu" and not (y.dtype.kind == "f" and np.all(np.mod(y, 1) == 0)):
        raise ValueError(f"{name} must hold integer class ids, got dtype {y.dtype}")
    y = y.reshape(-1).astype(np.int64)
    if y.size and y.min() < 0:
        raise ValueError(f"{name} holds a negative class id ({y.min()})")
    if num_classes is not None and y.size and y.max() >= num_classes:
        raise ValueError(f"{name} holds class id {y.max()}, outside [0, {num_classes})")
    return y


def _features(x, name: str, rows: int) -> np.ndarray:
    """`x` as float64 `[rows, D]`, refusing NaN or inf (a diverged model's) by name."""
    x = np.asarray(x, np.float64)
    if x.ndim != 2:
        raise ValueError(f"{name} must be [N, D] features, got shape {x.shape}")
    if len(x) != rows:
        raise ValueError(f"{name} has {len(x)} rows for {rows} labels")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} holds NaN or inf in {int(np.sum(~np.isfinite(x).all(axis=1)))} rows")
    return x


def topk_accuracy(logits: np.ndarray, labels: np.ndarray, k: int = 1) -> float:
    """Fraction of rows whose label is among the k largest logits. `[N, C]`, `[N]`."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    logits = np.asarray(logits)
    if logits.ndim != 2 or not len(logits):
        raise ValueError(f"logits must be [N, C] with N >= 1, got shape {logits.shape}")
    labels = _labels(labels, "labels")
    if len(labels) != len(logits):
        raise ValueError(f"{len(labels)} labels for {len(logits)} rows of logits")
    k = min(k, logits.shape[-1])
    top = np.argpartition(-logits, k - 1, axis=-1)[:, :k]
    return float(np.mean(np.any(top == labels[:, None], axis=-1)))


def feature_model(model):
    """What gives `model`'s frozen features: a keras_vit model's `feature_extractor()`, else itself."""
    return model.feature_extractor() if hasattr(model, "feature_extractor") else model


def extract_features(model, dataset, progress: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Frozen pre-logits features `[N, R or D]` and labels `[N]` of a `(images, labels)` dataset.

    `progress`: print a line to stderr at each tenth of the batches.
    """
    extractor = feature_model(model)
    batches, started = int(dataset.cardinality()), time.time()
    feats, labels = [], []
    for step, (images, y) in enumerate(dataset, 1):
        # predict_on_batch runs a traced graph; a plain call runs op by op, several times slower.
        feats.append(np.asarray(extractor.predict_on_batch(images), dtype=np.float64))
        labels.append(np.asarray(y).reshape(-1))
        if progress and (step == batches or step % max(1, batches // 10) == 0):
            done = sum(len(f) for f in feats)
            print(f"  {step}/{batches if batches >= 0 else '?'} batches, {done} images, "
                  f"{done / (time.time() - started):.1f} images/s", file=sys.stderr, flush=True)
    if not feats:
        raise ValueError("the dataset is empty: no features to extract")
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
    """Indices of `shots` examples per class present in `labels`, drawn without replacement."""
    if shots < 1:
        raise ValueError(f"shots must be >= 1, got {shots}")
    rng = np.random.RandomState(seed)
    picks = []
    for c in np.unique(labels):
        where = np.flatnonzero(labels == c)
        if len(where) < shots:
            raise ValueError(f"class {c} has {len(where)} examples, fewer than {shots} shots")
        picks.append(rng.choice(where, shots, replace=False))
    return np.concatenate(picks)


def fewshot_draws(train_y, shots: Iterable[int] = (1, 5, 10, 25),
                  seeds: Sequence[int] = (0, 1, 2)) -> Dict[Tuple[int, int], np.ndarray]:
    """{(shots, seed): training indices} that `fewshot_accuracy` fits each classifier on.

    Only these examples' features are needed, so a caller may extract those alone.
    """
    shots, seeds = [int(k) for k in shots], list(seeds)
    if not shots or not seeds:
        raise ValueError(f"need at least one shot count and one seed, got shots={shots} seeds={seeds}")
    train_y = _labels(train_y, "train_y")
    return {(k, seed): sample_shots(train_y, k, seed) for k in shots for seed in seeds}


def fewshot_accuracy(train_x: Union[np.ndarray, Callable[[np.ndarray], np.ndarray]], train_y,
                     test_x, test_y, shots: Iterable[int] = (1, 5, 10, 25),
                     seeds: Sequence[int] = (0, 1, 2), l2_reg: float = DEFAULT_L2,
                     num_classes: int = None) -> Dict[int, Tuple[float, float]]:
    """{shots: (mean accuracy, std over seeds)} of the ridge classifier on test features.

    Args:
      train_x: features `[N, D]` of the examples labelled `train_y [N]`, or a function
        from training indices `[n]` to their features `[n, D]`, for a caller that
        extracted only the examples `fewshot_draws` picks.
      test_x, test_y: `[M, D]`, `[M]`. A test class with no training examples counts as
        wrong, as it would in a deployed classifier.
      num_classes: default one more than the largest label of either set.
    """
    train_y, test_y = _labels(train_y, "train_y"), _labels(test_y, "test_y")
    num_classes = num_classes or int(max(train_y.max(initial=0), test_y.max(initial=0)) + 1)
    _labels(train_y, "train_y", num_classes)
    _labels(test_y, "test_y", num_classes)
    test_x = _features(test_x, "test_x", len(test_y))
    if callable(train_x):
        def features_of(idx):
            return _features(train_x(idx), "train_x(indices)", len(idx))
    else:
        full = _features(train_x, "train_x", len(train_y))

        def features_of(idx):
            return full[idx]
    accs = {}
    for (k, seed), idx in fewshot_draws(train_y, shots, seeds).items():
        x = features_of(idx)
        if x.shape[1] != test_x.shape[1]:
            raise ValueError(f"train features have {x.shape[1]} dimensions, test features {test_x.shape[1]}")
        clf = RidgeClassifier(l2_reg).fit(x, train_y[idx], num_classes)
        accs.setdefault(k, []).append(clf.accuracy(test_x, test_y))
    return {k: (float(np.mean(a)), float(np.std(a))) for k, a in accs.items()}


class FewShotPlan:
    """Which images a few-shot evaluation reads, fixed once, then run on any model (or on
    one model as it trains, `keras_vit.training.FewShotCallback`).

    Reads the splits' labels (no image) and draws the shots on construction, so a split
    too small for the shots fails here, before any forward pass. Only the drawn training
    images (at most shots x classes x seeds) and the test subset go through a model.

    Args:
      source: a `keras_vit.data` source; `train_split` gives the shots, `test_split` the score.
      shots, seeds: shot counts, and draws of each (seeds 0 .. seeds-1).
      test_examples: a random subset of the test split (default all of it).
      linear_probe_examples: random training images for a logistic-regression probe (0: none).
      seed: of the test and probe subsets.
    """

    def __init__(self, source, train_split: str, test_split: str, shots: Iterable[int] = (1, 5, 10, 25),
                 seeds: int = 3, test_examples: Optional[int] = None, linear_probe_examples: int = 0,
                 seed: int = 0):
        from keras_vit import data

        if seeds < 1:
            raise ValueError(f"seeds must be >= 1, got {seeds}")
        self.source, self.train_split, self.test_split = source, train_split, test_split
        self.shots, self.seeds = [int(k) for k in shots], int(seeds)
        rng = np.random.RandomState(seed)
        self.train_y = data.labels(source, train_split)
        self.draws = fewshot_draws(self.train_y, self.shots, range(self.seeds))
        self.probe = (np.sort(rng.choice(len(self.train_y), min(linear_probe_examples, len(self.train_y)),
                                         replace=False))
                      if linear_probe_examples else np.zeros(0, np.int64))
        self.wanted = np.unique(np.concatenate([*self.draws.values(), self.probe]))
        n_test = source.num_examples(test_split)
        self.test_positions = (np.sort(rng.choice(n_test, test_examples, replace=False))
                               if test_examples and test_examples < n_test else np.arange(n_test))

    def _features(self, extractor, model, split, positions, batch_size, progress):
        from keras_vit import data

        shape = model.inputs[0].shape
        ds = data.make_dataset(self.source, split, image_size=tuple(shape[1:3]), batch_size=batch_size,
                               training=False, channels=int(shape[-1]), examples=positions)
        return extract_features(extractor, ds, progress=progress)

    def run(self, model, batch_size: int = 64, l2_reg: float = DEFAULT_L2, log=print,
            progress: bool = True) -> dict:
        """{"fewshot": {shots: {"mean", "std"}}, "linear_probe": accuracy or None, counts} of `model`'s
        pre-logits features (a keras_vit model's `feature_extractor()`, else its outputs)."""
        log(f"Features of {len(self.wanted)} {self.train_split} images (the shots' draws"
            f"{' and the probe' if len(self.probe) else ''}) and {len(self.test_positions)} "
            f"{self.test_split} images ...")
        # One extractor for both passes: one traced predict function.
        extractor = feature_model(model)
        train_x, _ = self._features(extractor, model, self.train_split, self.wanted, batch_size, progress)
        test_x, test_y = self._features(extractor, model, self.test_split, self.test_positions, batch_size,
                                        progress)
        # From the labels the feature pass read: reading the whole test split's for it
        # up front would read every test image's bytes once more.
        unseen = sorted(set(test_y.tolist()) - set(self.train_y.tolist()))
        if unseen:
            log(f"Warning: {self.test_split} holds classes with no {self.train_split} examples, scored as "
                f"wrong: {[self.source.class_names[c] for c in unseen]}")

        def lookup(idx):
            return train_x[np.searchsorted(self.wanted, idx)]

        fewshot = fewshot_accuracy(lookup, self.train_y, test_x, test_y, shots=self.shots,
                                   seeds=range(self.seeds), l2_reg=l2_reg,
                                   num_classes=self.source.num_classes)
        out = {"fewshot": {k: {"mean": m, "std": s} for k, (m, s) in sorted(fewshot.items())},
               "linear_probe": None, "seeds": self.seeds, "test_examples": int(len(self.test_positions)),
               "feature_dim": int(train_x.shape[1])}
        if len(self.probe):
            out["linear_probe"] = linear_probe(lookup(self.probe), self.train_y[self.probe], test_x, test_y)
            out["linear_probe_examples"] = int(len(self.probe))
        return out


def linear_probe(train_x, train_y, test_x, test_y, c: float = 1.0, max_iter: int = 1000) -> float:
    """Test accuracy of a multinomial logistic regression on frozen, standardised features."""
    extras.require("sklearn", "eval")
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    clf = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter))
    clf.fit(train_x, np.asarray(train_y).reshape(-1))
    return float(clf.score(test_x, np.asarray(test_y).reshape(-1)))
