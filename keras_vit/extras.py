"""The optional parts of the package and the pip extras that install them.

`import keras_vit` needs TensorFlow, Keras, numpy, absl-py, safetensors and
huggingface_hub only. Each other dependency is imported where it is used, through
`require`, so that a missing one names the extra to install.
"""

from __future__ import annotations

import importlib

# extra -> what it is for (setup.cfg's [options.extras_require] lists the packages).
EXTRAS = {
    "data": "TFDS datasets, the offline Fashion-MNIST included (tensorflow-datasets)",
    "serving": "exports for TF Serving: warmup requests and models.config (tensorflow-serving-api)",
    "eval": "linear-probe evaluation (scikit-learn)",
    "viz": "the paper's figures and their demo photos (matplotlib, pillow, scikit-image)",
    "s3": "s3:// paths (tensorflow-io)",
    "pipeline": "the TFX pipeline (tfx, apache-beam and the three above it needs)",
}


def require(module: str, extra: str):
    """Imports and returns `module`, or raises an ImportError that names `extra`, the
    pip extra which installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"{module} is missing: {EXTRAS[extra]} needs the [{extra}] extra, "
                          f"pip install 'keras-vit[{extra}]'") from e
