"""Pretrained weights by name: the registry, and downloads from a server on 127.0.0.1
that serves generated checkpoints under the official bucket's layout and the Hugging
Face Hub's `resolve` contract. Nothing here reaches the network."""

import base64
import hashlib
import http.server
import json
import os
import subprocess
import sys
import textwrap
import threading

import google_crc32c
import numpy as np
import pytest
from conftest import data_path, randomise

import keras_vit
from keras_vit import pretrained
from keras_vit.pretrained import DownloadError, UnknownWeightsError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TI16 = "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
TI16_FILE = ("augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-"
             "lr_0.03-res_224.npz")
HF_COMMIT = "0123456789abcdef0123456789abcdef01234567"
TABBY = 281

# The official bucket's listing (vit_jax.ipynb, and the README's AugReg table): file and size.
OFFICIAL_SIZES_MIB = {
    "imagenet21k+imagenet2012/R50+ViT-B_16.npz": 377.57, "imagenet21k+imagenet2012/ViT-B_16-224.npz": 330.29,
    "imagenet21k+imagenet2012/ViT-B_16.npz": 331.4, "imagenet21k+imagenet2012/ViT-B_32.npz": 336.89,
    "imagenet21k+imagenet2012/ViT-B_8.npz": 334.78, "imagenet21k+imagenet2012/ViT-L_16-224.npz": 1.13 * 1024,
    "imagenet21k+imagenet2012/ViT-L_16.npz": 1.14 * 1024,
    "imagenet21k+imagenet2012/ViT-L_32.npz": 1.14 * 1024,
    "imagenet21k/R26+ViT-B_32.npz": 450.23, "imagenet21k/R50+ViT-B_16.npz": 439.85,
    "imagenet21k/R50+ViT-L_32.npz": 1.31 * 1024, "imagenet21k/ViT-B_16.npz": 393.69,
    "imagenet21k/ViT-B_32.npz": 400.01, "imagenet21k/ViT-B_8.npz": 393.72,
    "imagenet21k/ViT-H_14.npz": 2.46 * 1024,
    "imagenet21k/ViT-L_16.npz": 1.22 * 1024, "imagenet21k/ViT-L_32.npz": 1.23 * 1024,
    "sam/ViT-B_16.npz": 330.3, "sam/ViT-B_32.npz": 336.61, "sam/ViT-L_16.npz": 1.13 * 1024,
    "sam/ViT-L_32.npz": 1.14 * 1024,
    "augreg/L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0.npz": 1243,
    "augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz": 391,
    "augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz": 115,
    "augreg/R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1.npz": 1337,
    "augreg/R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0.npz": 170,
    "augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz": 37,
    "augreg/B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0.npz": 398,
    "augreg/S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0.npz": 118,
    "augreg/R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz": 40,
}


def test_every_entry_builds_the_architecture_its_official_file_holds():
    """Each registered file's size, from the official listing, is what the registry's
    model at its resolution, classes and pre-logits layer holds in float32: a wrong
    model, resolution or head in the registry would show as another size."""
    entries = pretrained.list_pretrained()
    assert len({e.name for e in entries}) == len(entries)
    by_file = {e.file: e for e in entries}
    assert set(OFFICIAL_SIZES_MIB) <= set(by_file)
    for file, listed in OFFICIAL_SIZES_MIB.items():
        ours = by_file[file].size_mib
        listed_precision = 0.01 * 1024 if listed > 1024 else 1.0  # the listing's GiB have two decimals
        assert abs(ours - listed) <= listed_precision, (file, ours, listed)
    for e in entries:
        assert e.model in keras_vit.list_models(), e
        if not e.on_hub:
            assert f"_{e.image_size}." in e.name, e  # timm's names carry the resolution
        assert e.inputs == "[-1, 1]"


def test_names_resolve_as_timm_spells_them_or_by_tag_or_by_file():
    assert pretrained.resolve(TI16).file == TI16_FILE
    assert pretrained.resolve("augreg_in21k_ft_in1k", model="ViT-Ti/16").name == TI16
    assert pretrained.resolve("augreg_in21k_ft_in1k", model="vit-ti_16", image_size=384).image_size == 384
    by_file = pretrained.resolve(TI16_FILE)
    assert by_file.name == TI16
    other = ("S_16-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0--oxford_iiit_pet-steps_2k-lr_0.003-"
             "res_384")
    for spelling in (other, f"augreg/{other}.npz"):
        e = pretrained.resolve(spelling)
        assert (e.model, e.image_size, e.file, e.num_classes) == (
            "ViT-S/16", 384, f"augreg/{other}.npz", None)
    with pytest.raises(UnknownWeightsError, match="closest: vit_tiny_patch16_224.augreg_in21k_ft_in1k"):
        pretrained.resolve("vit_tiny_patch16_224.augreg_in21k_ft_in1")
    with pytest.raises(UnknownWeightsError,
                       match="no 'sam_in1k' weights for ViT-Ti/16; its tags: augreg_in21k"):
        pretrained.resolve("sam_in1k", model="ViT-Ti/16")
    for name, count, first in [(TI16, 1000, "tench"),
                               ("vit_tiny_patch16_224.augreg_in21k", 21843, "organism")]:
        names = pretrained.class_names(name)
        assert (len(names), names[0]) == (count, first)
        assert all(names) and pretrained.resolve(name).num_classes == count
    assert [e.name for e in keras_vit.list_pretrained("*huge*")] == [
        "vit_huge_patch14_224.orig_in21k", "hf://google/vit-huge-patch14-224-in21k"]


class _Files(http.server.ThreadingHTTPServer):
    """Serves `files` (path -> bytes) with GCS's x-goog-hash; `broken` (path -> how)
    truncates a body or sends a wrong MD5; `requests` lists (method, path)."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.files, self.broken, self.requests = {}, {}, []
        self.lock = threading.Lock()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"

    def fetched(self, path):
        return sum(1 for m, p in self.requests if m == "GET" and p == path)


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, body_too):
        server = self.server
        with server.lock:
            server.requests.append((self.command, self.path))
        path = self.path.split("?")[0]
        body = server.files.get(path)
        if body is None:
            self.send_error(404)
            return
        how = server.broken.get(path)
        md5 = hashlib.md5(b"not this" if how == "bad_md5" else body).digest()
        crc = google_crc32c.Checksum(b"not this" if how == "bad_crc32c" else body).digest()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("x-goog-hash", f"crc32c={base64.b64encode(crc).decode()}")  # as GCS: two headers
        self.send_header("x-goog-hash", f"md5={base64.b64encode(md5).decode()}")
        if "/resolve/" in path:  # the Hub's contract for huggingface_hub
            self.send_header("X-Repo-Commit", HF_COMMIT)
            self.send_header("ETag", f'"{hashlib.sha256(body).hexdigest()}"')
        self.end_headers()
        if body_too:
            self.wfile.write(body[:len(body) // 3] if how == "truncate" else body)

    def do_HEAD(self):
        self._answer(False)

    def do_GET(self):
        self._answer(True)


@pytest.fixture(scope="module")
def ti16_file(tmp_path_factory):
    """A ViT-Ti/16 with random weights and 1000 classes, saved as the official file is."""
    model = randomise(keras_vit.create_model("ViT-Ti/16", num_classes=1000), seed=3)
    model.head.kernel.assign(np.random.RandomState(4).normal(0, 0.02, model.head.kernel.shape))
    bias = np.zeros(1000, "float32")
    bias[TABBY] = 12.0  # every image is a tabby cat: class 281 must be named so
    model.head.bias.assign(bias)
    return keras_vit.save_npz(model, str(tmp_path_factory.mktemp("ti16") / "ti16.npz"))


@pytest.fixture
def server(ti16_file, tmp_path, monkeypatch):
    files = _Files()
    with open(ti16_file, "rb") as f:
        files.files["/" + TI16_FILE] = f.read()
    thread = threading.Thread(target=files.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", files.url)
    monkeypatch.setenv("KERAS_VIT_HOME", str(tmp_path / "home"))
    for name in ("KERAS_VIT_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    yield files
    files.shutdown()
    files.server_close()


def _logits(model, seed=0):
    x = np.random.RandomState(seed).uniform(-1, 1, (2, *model.config.image_size, 3)).astype("float32")
    return model.predict(x, verbose=0)


def _cached(tmp_path):
    return os.path.join(str(tmp_path / "home"), "weights", *TI16_FILE.split("/"))


def test_a_name_downloads_once_and_fills_the_model_as_the_file_does(server, ti16_file, tmp_path, capfd):
    model = keras_vit.create_model(TI16)
    assert model.config.name == TI16 and model.config.num_classes == 1000
    assert server.fetched("/" + TI16_FILE) == 1
    err = capfd.readouterr().err
    assert f"Downloading {server.url}/{TI16_FILE} (" in err and f"Saved {server.url}/{TI16_FILE} to " in err
    by_path = keras_vit.create_model("ViT-Ti/16", weights=ti16_file)
    np.testing.assert_array_equal(_logits(model), _logits(by_path))
    again = keras_vit.create_model("ViT-Ti/16", weights="augreg_in21k_ft_in1k")  # the cache, no request
    assert server.fetched("/" + TI16_FILE) == 1
    np.testing.assert_array_equal(_logits(again), _logits(by_path))
    name = os.path.basename(TI16_FILE)
    assert sorted(os.listdir(os.path.dirname(_cached(tmp_path)))) == [name, name + ".lock"]
    wider = keras_vit.create_model(TI16, image_size=256)  # position embeddings resized, as for a path
    assert wider.config.image_size == (256, 256) and wider.position_embedding.embedding.shape[1] == 257


def test_offline_uses_the_cache_only_and_says_what_to_fetch(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KERAS_VIT_OFFLINE", "1")
    with pytest.raises(DownloadError) as e:
        keras_vit.create_model(TI16)
    assert f"{server.url}/{TI16_FILE} is not in the cache" in str(e.value)
    assert f"put it at {_cached(tmp_path)}" in str(e.value)
    assert server.requests == []
    monkeypatch.delenv("KERAS_VIT_OFFLINE")
    keras_vit.create_model(TI16)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert keras_vit.create_model(TI16).config.name == TI16
    assert len(server.requests) == 1


@pytest.mark.parametrize("how, message", [("truncate", "got 7,6[0-9,]* bytes where the server announced"),
                                          ("bad_md5", "its MD5 does not match the server's x-goog-hash"),
                                          ("bad_crc32c", "its CRC32C does not match the server's "
                                                         "x-goog-hash")])
def test_a_broken_download_is_named_and_leaves_nothing_in_the_cache(server, tmp_path, how, message):
    server.broken["/" + TI16_FILE] = how
    with pytest.raises(DownloadError, match=message) as e:
        keras_vit.create_model(TI16)
    assert f"{server.url}/{TI16_FILE}" in str(e.value)
    folder = os.path.dirname(_cached(tmp_path))
    assert os.listdir(folder) == [os.path.basename(TI16_FILE) + ".lock"]  # no file, no partial
    del server.broken["/" + TI16_FILE]
    assert keras_vit.create_model(TI16).config.name == TI16  # nothing taken for good: fetched again
    assert server.fetched("/" + TI16_FILE) == 2


def test_two_processes_download_one_file_once(server, tmp_path):
    script = textwrap.dedent(f"""
        import keras_vit, numpy as np
        model = keras_vit.create_model("{TI16}")
        x = np.random.RandomState(0).uniform(-1, 1, (1, 224, 224, 3)).astype("float32")
        print(float(model.predict(x, verbose=0).sum()))
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    assert server.fetched("/" + TI16_FILE) == 1
    assert outs[0][0].strip().splitlines()[-1] == outs[1][0].strip().splitlines()[-1]


def test_weights_from_a_url_or_a_bucket_mirror(server, ti16_file, monkeypatch):
    import tensorflow as tf

    by_url = keras_vit.create_model("ViT-Ti/16", weights=f"{server.url}/{TI16_FILE}")
    by_path = keras_vit.create_model("ViT-Ti/16", weights=ti16_file)
    np.testing.assert_array_equal(_logits(by_url), _logits(by_path))
    mirror = "ram://mirror/vit_models"
    tf.io.gfile.makedirs(f"{mirror}/augreg")
    tf.io.gfile.copy(ti16_file, f"{mirror}/{TI16_FILE}", overwrite=True)
    monkeypatch.setenv("KERAS_VIT_WEIGHTS_URL", mirror)
    monkeypatch.setenv("KERAS_VIT_HOME", str(os.path.dirname(ti16_file)) + "/other-home")
    assert keras_vit.create_model(TI16).config.name == TI16
    assert server.fetched("/" + TI16_FILE) == 1  # the URL's; the mirror served the name


def test_hugging_face_names_go_through_huggingface_hub_and_its_cache(server, tmp_path):
    repo = "google/vit-base-patch16-224"
    for name in ("config.json", "model.safetensors"):
        with open(os.path.join(data_path("hf_vit_tiny"), name), "rb") as f:
            server.files[f"/{repo}/resolve/main/{name}"] = f.read()
    script = textwrap.dedent(f"""
        import json, keras_vit, numpy as np
        model = keras_vit.create_model("hf://{repo}")
        ref = keras_vit.create_model(None, weights="{data_path('hf_vit_tiny')}")
        x = np.random.RandomState(0).uniform(-1, 1, (1, *model.config.image_size, 3)).astype("float32")
        same = bool(np.array_equal(model.predict(x, verbose=0), ref.predict(x, verbose=0)))
        print(json.dumps({{"name": model.config.name, "same": same}}))
    """)
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", HF_ENDPOINT=server.url,
               HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_TELEMETRY="1")
    for offline in ("0", "1"):  # the second run from huggingface_hub's cache alone
        proc = subprocess.run([sys.executable, "-c", script], env=dict(env, HF_HUB_OFFLINE=offline),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"name": f"hf://{repo}", "same": True}
    assert server.fetched(f"/{repo}/resolve/main/model.safetensors") == 1
    assert os.path.isdir(tmp_path / "hf" / "hub" / "models--google--vit-base-patch16-224")


def test_the_zoo_lists_the_pretrained_names():
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-m", "keras_vit.zoo", "--pretrained", "--pattern=*tiny_patch16*"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["name", "model", "px"]
    assert lines[2].split() == ["vit_tiny_patch16_384.augreg_in21k_ft_in1k", "ViT-Ti/16", "384",
                                "ImageNet-21k", "ImageNet-1k", "1000", "22", "78.22%"]
    assert "3 checkpoints; files cached in " in proc.stderr


def _cli(module, *args, env=None):
    env = dict(env or os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run([sys.executable, "-m", module, *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_predict_names_the_imagenet_classes_of_a_named_checkpoint(server, tmp_path):
    from planting import png

    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.png").write_bytes(png(np.full((40, 30, 3), 200, np.uint8)))
    (photos / "b.png").write_bytes(png(np.zeros((20, 20, 3), np.uint8)))
    table = _cli("keras_vit.predict", f"--model={TI16}", "--top_k=3", str(photos / "a.png"))
    assert table.returncode == 0, table.stderr[-3000:]
    lines = table.stdout.strip().splitlines()
    assert lines[0] == "a.png" and len(lines) == 4
    assert lines[1].split(None, 1)[1] == "tabby" and float(lines[1].split("%")[0]) > 90
    assert "Predicting 1 image(s) with vit_tiny_patch16_224.augreg_in21k_ft_in1k at 224x224" in table.stderr
    as_json = _cli("keras_vit.predict", f"--model={TI16}", "--json", str(photos), f"{server.url}/photo.png")
    assert as_json.returncode == 1 and f"cannot read {server.url}/photo.png" in as_json.stderr
    server.files["/photo.png"] = (photos / "b.png").read_bytes()
    as_json = _cli("keras_vit.predict", f"--model={TI16}", "--json", str(photos), f"{server.url}/photo.png")
    assert as_json.returncode == 0, as_json.stderr[-3000:]
    out = json.loads(as_json.stdout)
    assert [p["image"] for p in out["predictions"]] == ["a.png", "b.png", f"{server.url}/photo.png"]
    for p in out["predictions"]:
        assert len(p["top_k"]) == 5 and (p["top_k"][0]["index"], p["top_k"][0]["class"]) == (TABBY, "tabby")
    assert server.fetched("/" + TI16_FILE) == 1  # the second and third runs used the cache


def test_export_of_a_named_checkpoint_serves_the_imagenet_names(server, tmp_path):
    proc = _cli("keras_vit.export", f"--model={TI16}", f"--output_dir={tmp_path / 'served'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import tensorflow as tf

    served = tf.saved_model.load(str(tmp_path / "served" / "1")).signatures["predict_images"]
    out = served(images=tf.zeros((1, 224, 224, 3)))
    assert out["class_names"].numpy()[0].decode() == "tabby"


def test_any_augreg_file_is_a_name_checked_against_the_buckets_index(server, ti16_file):
    stem = TI16_FILE[len("augreg/"):-len(".npz")].replace("lr_0.03-res_224", "lr_0.01-res_224")
    server.files["/augreg/index.csv"] = (
        "name,filename,adapt_filename\n"
        f"Ti/16,{stem.split('--')[0]},{stem}\n"
        f"Ti/16,{stem.split('--')[0]},{stem.replace('res_224', 'res_384')}\n").encode()
    server.files[f"/augreg/{stem}.npz"] = server.files["/" + TI16_FILE]
    typo = stem.replace("lr_0.01", "lr_0.02")
    with pytest.raises(UnknownWeightsError, match=f"'{typo}' is not an AugReg file .* closest: {stem}"):
        keras_vit.create_model(typo)
    assert server.fetched(f"/augreg/{typo}.npz") == 0
    model = keras_vit.create_model(stem)
    assert (model.config.name, model.config.num_classes, model.config.image_size) == (stem, 1000, (224, 224))
    assert server.fetched("/augreg/index.csv") == 1


def test_a_cache_on_object_storage_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("KERAS_VIT_HOME", "gs://bucket/keras-vit")
    with pytest.raises(DownloadError,
                       match="KERAS_VIT_HOME=gs://bucket/keras-vit: the weights cache must be a local"):
        keras_vit.create_model(TI16)


def test_training_configs_take_pretrained_names():
    from keras_vit.training import ConfigError, TrainConfig

    TrainConfig(model="ViT-Ti/16", weights="augreg_in21k", steps=1).validate()
    TrainConfig(model=TI16, steps=1).validate()
    TrainConfig(model="ViT-Ti/16", weights="hf://google/vit-base-patch16-224", steps=1).validate()
    with pytest.raises(ConfigError, match="weights augreg_in22k not found \\(nor a pretrained name"):
        TrainConfig(model="ViT-Ti/16", weights="augreg_in22k", steps=1).validate()
