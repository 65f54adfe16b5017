"""The benchmarks' shared set-up: each case must run under the precision it reports."""

import keras
import pytest

import keras_vit
from benchmarks import measure
from keras_vit import zoo


def _tiny():
    return {"ours": keras_vit.create_model("ViT-Ti/16", num_classes=2, image_size=32)}


def test_fresh_models_builds_every_case_under_its_policy():
    """clear_session resets the global policy to float32: a second mixed_bfloat16 case
    once ran in float32 while reported as bf16."""
    for policy in ["mixed_bfloat16", "mixed_bfloat16", "float32", "mixed_bfloat16"]:
        model = measure.fresh_models(_tiny, policy)["ours"]
        assert model.dtype_policy.name == policy
        assert model.compute_dtype == ("bfloat16" if policy == "mixed_bfloat16" else "float32")


def test_fresh_models_refuses_a_model_built_under_another_policy():
    def build():
        keras.mixed_precision.set_global_policy("float32")
        return _tiny()

    with pytest.raises(RuntimeError, match="built under float32, not mixed_bfloat16"):
        measure.fresh_models(build, "mixed_bfloat16")


def test_zoo_describe_keeps_the_global_policy():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    zoo.describe("ViT-Ti/16", 32, 2)
    assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"


def test_the_timer_waits_on_one_element_of_each_result_not_a_copy_of_it():
    """Fetching a whole `[6304, 3072]` result copied it (15 ms, more than the op took),
    which added a constant to every large-output case and understated the matmul peak."""
    import numpy as np
    import tensorflow as tf

    big = tf.reshape(tf.range(6304 * 3072, dtype=tf.float32), [6304, 3072])
    aux = [tf.constant(7, tf.int64), tf.zeros([0, 4]), tf.Variable([[3.0]])]
    result = {"logits": big, "aux": aux, "loss": 0.5}
    fetched = measure._block(result)  # tf.nest visits a dict's keys in sorted order
    assert [f.tolist() for f in fetched] == [[7], [], [3.0], [0.0]]
    assert all(isinstance(f, np.ndarray) for f in fetched)
