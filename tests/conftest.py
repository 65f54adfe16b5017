"""Shared test setup: quiet TensorFlow, fixed seeds, the bundled test vectors."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

DATA = os.path.join(os.path.dirname(__file__), "data")


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    import keras

    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")
    keras.backend.clear_session()


def data_path(*parts):
    return os.path.join(DATA, *parts)


def load_io(name):
    with np.load(data_path(name)) as d:
        return {k: d[k] for k in d.files}
