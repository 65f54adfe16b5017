"""The serving export, tested as TF Serving and its clients use it."""

import base64
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pytest
import tensorflow as tf
import bf16_bounds
from conftest import data_path, free_port
from PIL import Image

import keras_vit
from keras_vit import preprocessing
from keras_vit.export import export_saved_model

CLASSES = [f"class_{i}" for i in range(10)]
VENV_BIN = os.path.dirname(sys.executable)


def encode(array, fmt):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
    return buf.getvalue()


def sample_images():
    rng = np.random.RandomState(0)
    rgb = rng.randint(0, 256, (40, 24, 3), dtype=np.uint8)
    return [
        encode(rgb, "PNG"),
        encode(rgb, "JPEG"),
        encode(rng.randint(0, 256, (32, 32), dtype=np.uint8), "PNG"),  # grayscale
        encode(rng.randint(0, 256, (20, 50, 4), dtype=np.uint8), "PNG"),  # RGBA
        encode(rgb, "GIF"),
        encode(rgb, "BMP"),
    ]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    model = keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz"))
    path = export_saved_model(model, str(root / "tiny"), class_names=CLASSES)
    return model, root, path


def expected_outputs(model, images):
    batch = tf.stack([preprocessing.decode_for_eval(b, (32, 32)) for b in images])
    logits = model.predict(batch, verbose=0)
    return tf.nn.softmax(logits).numpy(), batch.numpy()


def example(image):
    return tf.train.Example(features=tf.train.Features(feature={
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image]))})).SerializeToString()


def test_layout_versions_and_models_config(exported, tmp_path):
    model, root, path = exported
    assert path == str(root / "tiny" / "1")
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    assert not [d for d in os.listdir(root / "tiny") if d.startswith(".")], "staging dir left behind"
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = text_format.Parse((root / "models.config").read_text(),
                               model_server_config_pb2.ModelServerConfig())
    (entry,) = config.model_config_list.config
    assert (entry.name, entry.base_path, entry.model_platform) == ("tiny", str(root / "tiny"), "tensorflow")
    again = export_saved_model(model, str(tmp_path / "m"), class_names=CLASSES)
    assert again.endswith("/1")
    assert export_saved_model(model, str(tmp_path / "m"), class_names=CLASSES, warmup=False,
                              models_config_prefix="/models/").endswith("/2")
    assert 'base_path: "/models/m"' in (tmp_path / "models.config").read_text()
    with pytest.raises(FileExistsError):
        export_saved_model(model, str(tmp_path / "m"), class_names=CLASSES, version=2)


def test_export_rejects_bad_arguments(exported, tmp_path):
    model = exported[0]
    with pytest.raises(ValueError, match="3 class names for a model with 10 outputs"):
        export_saved_model(model, str(tmp_path / "x"), class_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="differs from the model's input size"):
        export_saved_model(model, str(tmp_path / "x"), image_size=64)


def test_a_model_without_a_head_is_served_as_features(tmp_path):
    features = keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz"), num_classes=0)
    path = export_saved_model(features, str(tmp_path / "features"))
    loaded = tf.saved_model.load(path)  # no keras_vit objects needed, as for classifiers
    _, pre = expected_outputs(features, sample_images())
    examples = [example(b) for b in sample_images()]
    for name, kwargs in [("serving_default", dict(image_bytes=tf.constant(sample_images()))),
                         ("serving_examples", dict(examples=tf.constant(examples))),
                         ("predict_images", dict(images=tf.constant(pre)))]:
        out = loaded.signatures[name](**kwargs)
        assert list(out) == ["features"]  # not a softmax over the features posing as classes
        np.testing.assert_allclose(out["features"].numpy(), features.predict(pre, verbose=0),
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"no head \(num_classes=0\), so no class names"):
        export_saved_model(features, str(tmp_path / "x"), class_names=["a"] * 64)
    one_logit = keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz"), num_classes=1)
    with pytest.raises(ValueError, match="a one-logit model needs activation='sigmoid'"):
        export_saved_model(one_logit, str(tmp_path / "y"))
    out = tf.saved_model.load(export_saved_model(one_logit, str(tmp_path / "y"), activation="sigmoid"))
    assert out.signatures["predict_images"](images=tf.constant(pre))["probabilities"].shape == (6, 1)


def test_saved_model_cli_lists_the_three_signatures(exported):
    out = subprocess.run([os.path.join(VENV_BIN, "saved_model_cli"), "show", "--dir", exported[2], "--all"],
                         capture_output=True, text=True, check=True).stdout
    for signature, key, dtype, shape in [("serving_default", "image_bytes", "DT_STRING", "(-1)"),
                                         ("serving_examples", "examples", "DT_STRING", "(-1)"),
                                         ("predict_images", "images", "DT_FLOAT", "(-1, 32, 32, 3)")]:
        block = out.split(f"signature_def['{signature}']:")[1].split("signature_def[")[0]
        assert f"inputs['{key}'] tensor_info:\n        dtype: {dtype}\n        shape: {shape}" in block
        for name, dt, sh in [("probabilities", "DT_FLOAT", "(-1, 10)"), ("classes", "DT_INT64", "(-1)"),
                             ("class_names", "DT_STRING", "(-1)"), ("top_k_classes", "DT_INT64", "(-1, 5)"),
                             ("top_k_probabilities", "DT_FLOAT", "(-1, 5)")]:
            assert f"outputs['{name}'] tensor_info:\n        dtype: {dt}\n        shape: {sh}" in block


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_saved_model_needs_no_xla(exported, tmp_path, policy):
    """TF Serving refuses XLA-compiled functions on CPU unless started with
    --xla_cpu_compilation_enabled. Training's XLA-fused GELU and the XLA GELU that a
    bf16 `predict` takes must stay out, even when the model has just predicted."""
    from tensorflow.core.protobuf import saved_model_pb2

    from keras_vit.layers.fast_paths import CONV_MIN_ROWS
    from keras_vit.precision import with_policy

    model, _, path = exported
    if policy != "float32":
        model = with_policy(model, policy)
        tokens = model.get_layer("posembed_input").output.shape[1]
        model.predict(np.zeros((-(-CONV_MIN_ROWS // tokens), 32, 32, 3), "float32"), verbose=0)
        path = export_saved_model(model, str(tmp_path / "m"), class_names=CLASSES, warmup=False)
    saved = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        saved.ParseFromString(f.read())
    graph = saved.meta_graphs[0].graph_def
    functions = list(graph.library.function)
    assert functions
    compiled = [f.signature.name for f in functions if f.attr["_XlaMustCompile"].b]
    ops = {n.op for n in graph.node} | {n.op for f in functions for n in f.node_def}
    assert not compiled and not ops & {"XlaLaunch", "_XlaCompile", "_XlaRun"}, compiled


def test_saved_model_cli_run_on_a_png(exported, tmp_path):
    npy = tmp_path / "inputs.npy"
    np.save(npy, np.array([sample_images()[0]], dtype="S"))  # fixed-width bytes: no pickle
    out = subprocess.run([os.path.join(VENV_BIN, "saved_model_cli"), "run", "--dir", exported[2],
                          "--tag_set", "serve", "--signature_def", "serving_default",
                          "--inputs", f"image_bytes={npy}", "--outdir", str(tmp_path / "out")],
                         capture_output=True, text=True, check=True)
    del out
    probs = np.load(tmp_path / "out" / "probabilities.npy")
    expected, _ = expected_outputs(exported[0], sample_images()[:1])
    np.testing.assert_allclose(probs, expected, atol=1e-5)


FRESH_PROCESS = textwrap.dedent("""
    import os, sys, numpy as np, tensorflow as tf
    # Arguments: the SavedModel, then pairs of an images folder and the .npz to write.
    path, pairs = sys.argv[1], sys.argv[2:]
    sig = tf.saved_model.load(path).signatures
    as_array = lambda t: t.numpy().astype("S") if t.dtype == tf.string else t.numpy()
    for images_dir, out in zip(pairs[::2], pairs[1::2]):
        names = sorted(n for n in os.listdir(images_dir) if n.endswith(".img"))
        images = [open(os.path.join(images_dir, n), "rb").read() for n in names]
        examples = [tf.train.Example(features=tf.train.Features(feature={"image": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[b]))})).SerializeToString() for b in images]
        a = sig["serving_default"](image_bytes=tf.constant(images))
        b = sig["serving_examples"](examples=tf.constant(examples))
        c = sig["predict_images"](images=tf.constant(np.load(os.path.join(images_dir, "pre.npy"))))
        np.savez(out, **{f"{k}_{n}": as_array(v) for k, r in (("bytes", a), ("examples", b), ("pre", c))
                         for n, v in r.items()})
    assert not any(m == "keras_vit" or m.startswith("keras_vit.") for m in sys.modules), "imported keras_vit"
""")


@pytest.mark.parametrize("onednn", ["1", "0"])
def test_fresh_process_without_keras_vit_gives_the_models_probabilities(exported, tmp_path, onednn):
    """Also with oneDNN's graph rewrites off (TF_ENABLE_ONEDNN_OPTS=0): the LayerNorms
    were exported in the form oneDNN rewrites, which must compute the same without it."""
    model, _, path = exported
    images = sample_images()
    expected, pre = expected_outputs(model, images)
    for i, image in enumerate(images):
        (tmp_path / f"{i:02d}.img").write_bytes(image)
    np.save(tmp_path / "pre.npy", pre)
    script = tmp_path / "serve.py"
    script.write_text(FRESH_PROCESS)
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TF_ENABLE_ONEDNN_OPTS": onednn}
    run = subprocess.run([sys.executable, str(script), path, str(tmp_path), str(tmp_path / "out.npz")],
                         env=env, cwd=str(tmp_path), capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    with np.load(tmp_path / "out.npz") as out:
        for kind in ("bytes", "examples", "pre"):
            np.testing.assert_allclose(out[f"{kind}_probabilities"], expected, atol=1e-5)
            np.testing.assert_array_equal(out[f"{kind}_classes"], expected.argmax(-1))
            names = [n.decode() for n in out[f"{kind}_class_names"]]
            assert names == [CLASSES[i] for i in expected.argmax(-1)]
            np.testing.assert_array_equal(out[f"{kind}_top_k_classes"][:, 0], expected.argmax(-1))
            np.testing.assert_allclose(out[f"{kind}_top_k_probabilities"],
                                       -np.sort(-expected, axis=-1)[:, :5], atol=1e-5)


def test_bf16_export_in_a_fresh_process_takes_either_projection_form(exported, tmp_path):
    """A mixed_bfloat16 export holds both forms of the encoder's projections (1x1
    convolutions from CONV_MIN_ROWS rows, matmuls below): batches on each side of
    the threshold give the Keras model's probabilities, with oneDNN's rewrites on and off."""
    from keras_vit.layers.fast_paths import CONV_MIN_ROWS
    from keras_vit.precision import with_policy

    mixed = with_policy(exported[0], "mixed_bfloat16")
    path = export_saved_model(mixed, str(tmp_path / "bf16"), class_names=CLASSES, warmup=False)
    tokens = mixed.get_layer("posembed_input").output.shape[1]
    many = sample_images() * -(-CONV_MIN_ROWS // (tokens * len(sample_images())))
    assert len(many) * tokens >= CONV_MIN_ROWS > len(sample_images()) * tokens
    expected, exact = {}, {}
    for name, images in (("few", sample_images()), ("many", many)):
        expected[name], pre = expected_outputs(mixed, images)
        exact[name] = expected_outputs(exported[0], images)[0]
        folder = tmp_path / name
        folder.mkdir()
        for i, image in enumerate(images):
            (folder / f"{i:03d}.img").write_bytes(image)
        np.save(folder / "pre.npy", pre)
        # The mixed model in either form is as accurate as its portable graph.
        portable = tf.nn.softmax(tf.function(lambda t: mixed(t, training=False))(pre)).numpy()
        bf16_bounds.assert_as_accurate(expected[name], portable, exact[name], f"{name}: predict")
    script = tmp_path / "serve.py"
    script.write_text(FRESH_PROCESS)
    for onednn in ("1", "0"):
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TF_ENABLE_ONEDNN_OPTS": onednn}
        pairs = [str(p) for name in expected for p in (tmp_path / name, tmp_path / f"{name}_{onednn}.npz")]
        run = subprocess.run([sys.executable, str(script), path, *pairs],
                             env=env, cwd=str(tmp_path), capture_output=True, text=True)
        assert run.returncode == 0, run.stderr[-3000:]
        for name in expected:
            with np.load(tmp_path / f"{name}_{onednn}.npz") as out:
                for kind in ("bytes", "examples", "pre"):
                    # TF's own kernels (oneDNN off) round to bf16 in other places.
                    bf16_bounds.assert_as_accurate(out[f"{kind}_probabilities"], expected[name], exact[name],
                                                   f"{name}, oneDNN {onednn}: served {kind}")


def test_in_graph_preprocessing_matches_the_input_pipeline():
    scaled = lambda a: a.astype(np.float32) / np.float32(127.5) - np.float32(1)  # noqa: E731
    rgb = np.random.RandomState(1).randint(0, 256, (32, 32, 3), dtype=np.uint8)
    decoded = preprocessing.decode_for_eval(encode(rgb, "PNG"), 32).numpy()
    np.testing.assert_array_equal(decoded, scaled(rgb))
    gray = rgb[..., 0]
    decoded = preprocessing.decode_for_eval(encode(gray, "PNG"), 32).numpy()
    for ch in range(3):
        np.testing.assert_array_equal(decoded[..., ch], scaled(gray))
    rgba = np.concatenate([rgb, np.full((32, 32, 1), 7, np.uint8)], -1)
    np.testing.assert_array_equal(preprocessing.decode_for_eval(encode(rgba, "PNG"), 32).numpy(), scaled(rgb))
    big = preprocessing.decode_for_eval(encode(rgb, "PNG"), (64, 48)).numpy()
    resized = tf.image.resize(rgb.astype(np.float32), (64, 48)).numpy()
    np.testing.assert_allclose(big, scaled(resized), atol=1e-6)


def test_predict_requests_map_onto_each_signature(exported):
    from tensorflow_serving.apis import predict_pb2

    model, _, path = exported
    loaded = tf.saved_model.load(path)
    images = sample_images()[:2]
    expected, pre = expected_outputs(model, images)
    inputs = {"serving_default": ("image_bytes", images, tf.string),
              "serving_examples": ("examples", [example(b) for b in images], tf.string),
              "predict_images": ("images", pre, tf.float32)}
    for signature, (key, value, dtype) in inputs.items():
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        request.model_spec.signature_name = signature
        request.inputs[key].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
        request = predict_pb2.PredictRequest.FromString(request.SerializeToString())  # over the wire
        fn = loaded.signatures[request.model_spec.signature_name]
        spec = fn.structured_input_signature[1]
        assert set(request.inputs) == set(spec)
        feed = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        for k, t in feed.items():
            assert t.dtype == spec[k].dtype and spec[k].shape.is_compatible_with(t.shape)
        np.testing.assert_allclose(fn(**feed)["probabilities"].numpy(), expected, atol=1e-5)


def test_warmup_requests_parse_and_run(exported):
    from tensorflow_serving.apis import prediction_log_pb2

    path = exported[2]
    loaded = tf.saved_model.load(path)
    records = list(tf.data.TFRecordDataset(os.path.join(path, "assets.extra", "tf_serving_warmup_requests")))
    assert len(records) == 2
    for record in records:
        log = prediction_log_pb2.PredictionLog.FromString(record.numpy())
        request = log.predict_log.request
        assert request.model_spec.name == "tiny"
        fn = loaded.signatures[request.model_spec.signature_name]
        out = fn(**{k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()})
        assert out["probabilities"].shape == (1, 10)


def test_bad_input_is_named_and_wrong_types_are_rejected(exported):
    sig = tf.saved_model.load(exported[2]).signatures
    good = sample_images()[0]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"image_bytes\[1\] \(23 bytes\) is not a JPEG, PNG, GIF or BMP image"):
        sig["serving_default"](image_bytes=tf.constant([good, b"definitely not an image"]))
    noise = np.random.RandomState(0).randint(0, 256, (40, 30, 3)).astype(np.uint8)
    cut = tf.io.encode_jpeg(noise).numpy()[:-200]
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"image_bytes\[1\] \({len(cut)} bytes, 40x30\) "
                       "does not decode: its body is truncated or corrupt"):
        sig["serving_default"](image_bytes=tf.constant([good, cut]))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"examples.image\[0\] \(9 bytes\) is not a JPEG"):
        sig["serving_examples"](examples=tf.constant([example(b"GIF7 nope")]))
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        sig["serving_default"](image_bytes=tf.constant([1.0, 2.0]))
    with pytest.raises((TypeError, ValueError, tf.errors.InvalidArgumentError)):
        sig["predict_images"](images=tf.zeros([1, 16, 16, 3]))


@pytest.mark.skipif(shutil.which("tensorflow_model_server") is None,
                    reason="tensorflow_model_server is not on PATH (no TF Serving binary on this machine)")
def test_live_tf_serving_rest_and_grpc(exported):
    import grpc
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    model, root, _ = exported
    grpc_port, rest_port = free_port(), free_port()
    server = subprocess.Popen(["tensorflow_model_server", f"--port={grpc_port}",
                               f"--rest_api_port={rest_port}", "--rest_api_num_threads=2",
                               f"--model_config_file={root / 'models.config'}", "--enable_batching",
                               f"--batching_parameters_file={root / 'batching_parameters.txt'}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{rest_port}/v1/models/tiny"
        for _ in range(120):
            try:
                status = json.loads(urllib.request.urlopen(url, timeout=2).read())
                if status["model_version_status"][0]["state"] == "AVAILABLE":
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("TF Serving did not make the model available in 60 s")
        images = sample_images()[:2]
        expected, _ = expected_outputs(model, images)
        body = json.dumps({"instances": [{"b64": base64.b64encode(b).decode()} for b in images]}).encode()
        reply = json.loads(urllib.request.urlopen(urllib.request.Request(f"{url}:predict", data=body),
                                                  timeout=30).read())
        np.testing.assert_allclose([p["probabilities"] for p in reply["predictions"]], expected, atol=1e-5)
        stub = prediction_service_pb2_grpc.PredictionServiceStub(
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "tiny"
        request.model_spec.signature_name = "serving_default"
        request.inputs["image_bytes"].CopyFrom(tf.make_tensor_proto(images, dtype=tf.string))
        response = stub.Predict(request, timeout=30)
        np.testing.assert_allclose(tf.make_ndarray(response.outputs["probabilities"]), expected, atol=1e-5)
    finally:
        server.terminate()
        server.wait(timeout=30)


def _variables(version_dir):
    prefix = os.path.join(version_dir, "variables", "variables")
    dtypes = tf.train.load_checkpoint(prefix).get_variable_to_dtype_map()
    size = sum(os.path.getsize(os.path.join(version_dir, "variables", f))
               for f in os.listdir(os.path.join(version_dir, "variables")) if ".data-" in f)
    return {name: d.name for name, d in dtypes.items() if "/.ATTRIBUTES/" in name and d.is_floating}, size


def test_mixed_precision_export_stores_bf16_weights_with_the_same_outputs(exported, tmp_path):
    from keras_vit.precision import with_policy

    mixed = with_policy(exported[0], "mixed_bfloat16")
    cast = export_saved_model(mixed, str(tmp_path / "cast"), class_names=CLASSES, warmup=False)
    kept = export_saved_model(mixed, str(tmp_path / "kept"), class_names=CLASSES, warmup=False,
                              weights_in_compute_dtype=False)
    cast_dtypes, cast_size = _variables(cast)
    kept_dtypes, kept_size = _variables(kept)
    assert set(kept_dtypes.values()) == {"float32"}
    assert set(cast_dtypes.values()) == {"bfloat16", "float32"}
    assert sum(d == "bfloat16" for d in cast_dtypes.values()) > len(cast_dtypes) // 2
    assert cast_size < 0.7 * kept_size
    images = sample_images()
    expected, pre = expected_outputs(mixed, images)
    for path in (cast, kept):
        out = tf.saved_model.load(path).signatures["predict_images"](images=tf.constant(pre))
        np.testing.assert_allclose(out["probabilities"].numpy(), expected, rtol=1e-6, atol=1e-7)
        if path == cast:
            first = out["probabilities"].numpy()
    np.testing.assert_array_equal(first, out["probabilities"].numpy())


def test_command_line_export_says_where_it_wrote(exported, tmp_path):
    model = exported[0]
    model.save(str(tmp_path / "tiny.keras"))
    run = subprocess.run([sys.executable, "-m", "keras_vit.export", f"--model={tmp_path / 'tiny.keras'}",
                          f"--output_dir={tmp_path / 'serving' / 'tiny'}",
                          "--class_names=" + ",".join(CLASSES)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"Wrote SavedModel to {tmp_path / 'serving' / 'tiny' / '1'}" in run.stdout
    assert (tmp_path / "serving" / "models.config").exists()
    assert "policy float32, weights stored as float32" in run.stderr
    # TensorFlow's INFO lines on writing a SavedModel are not shown by default.
    assert "Assets written to" not in run.stderr and "fingerprint" not in run.stderr
    sig = tf.saved_model.load(str(tmp_path / "serving" / "tiny" / "1")).signatures["serving_default"]
    out = sig(image_bytes=tf.constant(sample_images()[:1]))
    assert out["class_names"].numpy()[0].decode() in CLASSES


def test_command_line_export_of_a_checkpoint_at_another_resolution(tmp_path):
    hf = data_path("hf_vit_tiny")
    run = subprocess.run([sys.executable, "-m", "keras_vit.export", f"--model={hf}", "--image_size=48",
                          f"--output_dir={tmp_path / 'hf'}"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert f"Wrote SavedModel to {tmp_path / 'hf' / '1'}" in run.stdout
    loaded = tf.saved_model.load(str(tmp_path / "hf" / "1"))
    batch = tf.stack([preprocessing.decode_for_eval(b, (48, 48)) for b in sample_images()])
    model = keras_vit.create_model(None, weights=hf, image_size=48)
    expected = tf.nn.softmax(model.predict(batch, verbose=0))
    out = loaded.signatures["predict_images"](images=batch)
    np.testing.assert_allclose(out["probabilities"].numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    # The class names come from the checkpoint's id2label when none are given.
    names = loaded.signatures["serving_default"](image_bytes=tf.constant(sample_images()))["class_names"]
    assert {n.decode() for n in names.numpy().ravel()} <= set(CLASSES)
    run = subprocess.run([sys.executable, "-m", "keras_vit.export", f"--model={tmp_path / 'x.keras'}",
                          "--image_size=48", f"--output_dir={tmp_path / 'x'}"],
                         capture_output=True, text=True)
    assert run.returncode != 0 and "image_size applies to checkpoints" in run.stderr


def test_command_line_export_in_another_precision(exported, tmp_path):
    from keras_vit.precision import with_policy

    exported[0].save(str(tmp_path / "tiny.keras"))
    run = subprocess.run([sys.executable, "-m", "keras_vit.export", f"--model={tmp_path / 'tiny.keras'}",
                          f"--output_dir={tmp_path / 'tiny'}", "--precision=mixed_bfloat16"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "policy mixed_bfloat16, weights stored as bfloat16, float32" in run.stderr
    assert "bfloat16" in _variables(str(tmp_path / "tiny" / "1"))[0].values()
    expected, pre = expected_outputs(with_policy(exported[0], "mixed_bfloat16"), sample_images())
    signature = tf.saved_model.load(str(tmp_path / "tiny" / "1")).signatures["predict_images"]
    out = signature(images=tf.constant(pre))
    np.testing.assert_allclose(out["probabilities"].numpy(), expected, rtol=1e-6, atol=1e-7)


def test_serving_matches_the_training_input_pipeline(exported, tmp_path):
    """The served model on raw bytes equals the Keras model on keras_vit.data's eval batches."""
    from keras_vit import data

    model, _, path = exported
    rng = np.random.RandomState(5)
    files = []
    for label in ("a", "b"):
        folder = tmp_path / "test" / label
        folder.mkdir(parents=True)
        for i, (shape, fmt) in enumerate([((40, 24, 3), "PNG"), ((32, 32), "PNG"), ((50, 20, 3), "JPEG")]):
            file = folder / f"{i}.{fmt.lower().replace('jpeg', 'jpg')}"
            file.write_bytes(encode(rng.randint(0, 256, shape, dtype=np.uint8), fmt))
            files.append(file)
    # A 12 MP phone-size photo: both decode it at 1/8 scale (504x378), then resize.
    y, x = np.ogrid[0:3024, 0:4032]
    photo = np.stack(np.broadcast_arrays((x // 16) % 256, (y // 12) % 256, (x + y) // 28 % 256), -1)
    files.append(tmp_path / "test" / "a" / "phone.jpg")
    files[-1].write_bytes(encode(photo.astype(np.uint8), "JPEG"))
    source = data.open_source(image_dir=str(tmp_path))
    names, images = [], []
    for ex in source.raw("test"):
        names.append(ex["image/filename"].numpy().decode())
        images.append(ex["image"].numpy())
    pipeline_batch = next(iter(data.make_dataset(source, "test", image_size=32, batch_size=len(files),
                                                 training=False)))[0]
    expected = tf.nn.softmax(model.predict(pipeline_batch, verbose=0)).numpy()
    served = tf.saved_model.load(path).signatures["serving_default"](image_bytes=tf.constant(images))
    np.testing.assert_allclose(served["probabilities"].numpy(), expected, atol=1e-5)
    assert len(set(names)) == len(files)
