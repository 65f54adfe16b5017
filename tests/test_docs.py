"""The docs a user copies from: the README's quick start and command-line examples run,
and every link in the docs leads somewhere."""

import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", "benchmarks/README.md",
         *sorted(f"docs/{p}" for p in os.listdir(os.path.join(ROOT, "docs")))]


def _read(page):
    with open(os.path.join(ROOT, page)) as f:
        return f.read()


def _blocks(page, language):
    return re.findall(rf"```{language}\n(.*?)```", _read(page), re.S)


def _section(page, heading):
    text = _read(page)
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def _env(tmp_path):
    # TFDS prepares its data under TFDS_DATA_DIR: the fake Fashion-MNIST never reaches the user's.
    return {**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2",
            "TFDS_DATA_DIR": str(tmp_path / "tfds")}


def test_the_quick_start_runs_as_written(tmp_path):
    quick = _blocks("README.md", "python")[0]
    assert 'create_model("ViT-Ti/16", num_classes=10, image_size=64)' in quick
    done = subprocess.run([sys.executable, "-c", quick], cwd=tmp_path, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "(8, 3, 17, 17)" in done.stdout
    assert (tmp_path / "vit.keras").exists()


def _commands(block):
    """The commands of a shell block: continuations joined, comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [shlex.split(line.split(" # ")[0]) for line in joined.splitlines() if line.strip()]


# What makes each README example small enough for the suite, on the same model and flags.
QUICKER = {
    "keras_vit.train": ["--steps=2", "--batch_size=8", "--warmup_steps=1", "--precision=float32"],
    "keras_vit.evaluate": ["--shots=1", "--seeds=1", "--test_examples=20", "--precision=float32"],
    "keras_vit.export": ["--notune_batching"],
    "keras_vit.visualize": ["--max_images=2"],
}


def test_the_command_line_examples_run_in_order(fake_fmnist, tmp_path):
    from PIL import Image

    commands = _commands(re.search(r"```sh\n(.*?)```", _section("README.md", "Command-line tools"), re.S)[1])
    modules = [c[2] for c in commands]
    assert modules == ["keras_vit.train", "keras_vit.evaluate", "keras_vit.export", "keras_vit.predict",
                       "keras_vit.visualize", "keras_vit.zoo", "keras_vit.batching"]
    photo = np.random.RandomState(0).randint(0, 255, (40, 30, 3), np.uint8)
    Image.fromarray(photo).save(tmp_path / "photo.jpg")
    for command in commands:
        module = command[2]
        if module == "keras_vit.train":
            command = [a for a in command if not a.startswith("--epochs")]
        if module == "keras_vit.predict":  # the named checkpoint is a download: the trained model instead
            command = [a if not a.startswith("--model=") else "--model=runs/fmnist/model.keras"
                       for a in command]
        done = subprocess.run([sys.executable, *command[1:], *QUICKER.get(module, [])], cwd=tmp_path,
                              env=_env(tmp_path), capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (command, done.stderr[-3000:])
    assert (tmp_path / "saved_models" / "fmnist" / "1" / "saved_model.pb").exists()
    assert (tmp_path / "saved_models" / "batching_parameters.txt").exists()
    assert list((tmp_path / "reports" / "fmnist").glob("*.png"))


def _anchor(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES)
def test_every_link_leads_to_a_file_and_heading_that_exist(page):
    for target in re.findall(r"\]\(([^)\s]+)\)", _read(page)):
        if re.match(r"https?://", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else \
            os.path.join(ROOT, page)
        assert os.path.exists(resolved), f"{page}: {target}"
        if anchor:
            headings = re.findall(r"^#+ (.*)$", open(resolved).read(), re.M)
            assert anchor in {_anchor(h) for h in headings}, f"{page}: {target}"


@pytest.mark.parametrize("page", PAGES)
def test_the_docs_speak_of_the_product_not_of_its_history(page):
    text = _read(page)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dates belong to git"
    assert not re.search(r"\b(issue's|the issue|this session|earlier sessions?)\b", text, re.I)
    assert "MEASURE_" not in text
