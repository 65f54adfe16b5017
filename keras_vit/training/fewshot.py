"""Few-shot accuracy while a model trains, as big_vision tracks a pre-training run."""

from __future__ import annotations

import keras
from absl import logging

from keras_vit.evaluation import DEFAULT_L2, FewShotPlan


class FewShotCallback(keras.callbacks.Callback):
    """Scores `plan` (a `keras_vit.evaluation.FewShotPlan`) on the model at the end of an epoch.

    It runs after the first epoch of each `fit` call (a resumed run's included), every
    `every`-th epoch counted from the start, and the last. It adds
    `fewshot_{k}shot` (the mean over seeds) to that epoch's logs, so callbacks listed
    after it (CSVLogger, TensorBoard, History) record it; `last` holds the full result.
    Under `fit` each epoch is one of keras_vit's chunks.
    """

    def __init__(self, plan: FewShotPlan, every: int = 1, batch_size: int = 64, l2_reg: float = DEFAULT_L2):
        super().__init__()
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.plan, self.every, self.batch_size, self.l2_reg = plan, int(every), int(batch_size), l2_reg
        self.last = None
        self._first = None

    def on_train_begin(self, logs=None):
        self._first = None

    def on_epoch_end(self, epoch, logs=None):
        if self._first is None:
            self._first = epoch
        if not (epoch == self._first or (epoch + 1) % self.every == 0
                or epoch + 1 == self.params.get("epochs")):
            return
        self.last = self.plan.run(self.model, self.batch_size, self.l2_reg, log=logging.info, progress=False)
        scores = {f"fewshot_{k}shot": acc["mean"] for k, acc in self.last["fewshot"].items()}
        logging.info("few-shot after epoch %d: %s", epoch + 1,
                     ", ".join(f"{k} {v:.4f}" for k, v in scores.items()))
        if logs is not None:
            logs.update(scores)
