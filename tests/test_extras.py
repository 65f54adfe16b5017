"""The model package without its extras: what imports, and what names the extra it needs."""

import configparser
import os
import subprocess
import sys
import textwrap

from keras_vit import extras

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every module an extra provides, hidden from the child process.
_HIDDEN = ("tensorflow_datasets", "tensorflow_serving", "tfx", "apache_beam", "sklearn", "matplotlib", "PIL",
           "skimage", "tensorflow_io")


def _run_without_extras(body: str) -> subprocess.CompletedProcess:
    code = textwrap.dedent(f"""
        import importlib.abc, sys
        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {_HIDDEN!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Hide())
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})


def test_the_model_package_needs_no_extra_and_names_the_one_a_feature_needs(tmp_path):
    proc = _run_without_extras(f"""
        import numpy as np
        import keras_vit
        from keras_vit import data, evaluation, export
        from keras_vit.training import TrainConfig

        model = keras_vit.create_model("FMNIST-ViT")
        assert model.predict(np.zeros((2, 28, 28, 3), "float32"), verbose=0).shape == (2, 10)
        # An image folder needs no TFDS.
        assert isinstance(data.open_source(image_dir={str(tmp_path)!r}), data.ImageFolderSource)

        def refused(fn, extra):
            try:
                fn()
            except ImportError as e:
                assert f"pip install 'keras-vit[{{extra}}]'" in str(e), e
            else:
                raise AssertionError(f"no ImportError naming [{{extra}}]")

        refused(lambda: data.open_source("fashion_mnist_local"), "data")
        refused(lambda: export.write_models_config({str(tmp_path)!r}), "serving")
        probe = lambda: evaluation.linear_probe(np.zeros((4, 2)), [0, 1, 0, 1], np.zeros((2, 2)), [0, 1])
        refused(probe, "eval")
        from keras_vit.visualize import plots
        refused(plots.pyplot, "viz")
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_setup_cfg_offers_every_extra_the_package_names():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    offered = set(cfg["options.extras_require"])
    assert offered == set(extras.EXTRAS) | {"all"}
    assert cfg["options.extras_require"]["all"].split() == [f"keras-vit[{','.join(extras.EXTRAS)}]"]
