"""Images/s of the model at this checkout against another git revision, side by side.

    make bench BENCH=revisions BENCH_ARGS="--baseline=HEAD~1"
    python -m benchmarks.revisions --baseline=main --modes=inference,train --models=ViT-Ti/16

The baseline is checked out into a temporary git worktree. For every model, mode,
precision and batch size, two worker processes (one per revision, each importing its
own `keras_vit`) build the same model with the same weights, trace and warm it up, then
take turns: in each round each worker times its calls (the fastest of `--calls`), the
order alternating between rounds, so that both see the same load. It prints each side's
images/s (of its fastest round) and the median of the rounds' paired ratios with a 90%
bootstrap interval (`measure.speedup`). bf16 runs only where the cores have bf16
instructions (`keras_vit.hardware`). Figures, never assertions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from absl import app, flags

from benchmarks import measure

FLAGS = flags.FLAGS
flags.DEFINE_string("baseline", "HEAD", "The git revision to compare this checkout against.")
flags.DEFINE_list("models", ["ViT-Ti/16", "ViT-S/16"], "Registered model names.")
flags.DEFINE_list("modes", ["inference", "train"], "Forward passes (predict_step), or training steps.")
flags.DEFINE_list("precisions", ["float32", "mixed_bfloat16"],
                  "Keras dtype policies (bf16 only where the cores have bf16 instructions).")
flags.DEFINE_list("batch_sizes", ["32"], "Batch sizes.")
flags.DEFINE_integer("rounds", 15, "Paired rounds per case.", lower_bound=3)
flags.DEFINE_integer("calls", 3, "Calls per worker per round; the round's time is the fastest.",
                     lower_bound=1)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What each worker runs, with its revision's checkout first on sys.path. It reads one
# command a line: a case as JSON (build it, warm up, answer "ready"), or "time" (answer
# the fastest of `calls` calls, in seconds).
_WORKER = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import importlib.util
spec = importlib.util.spec_from_file_location("measure", sys.argv[2])
measure = importlib.util.module_from_spec(spec); spec.loader.exec_module(measure)
import numpy as np
call = None
for line in sys.stdin:
    if line.strip() == "time":
        times = []
        for _ in range(case["calls"]):
            start = time.perf_counter(); measure.wait_for(call()); times.append(time.perf_counter() - start)
        print(min(times), flush=True)
        continue
    case = json.loads(line)
    import keras, keras_vit
    from keras_vit.configs import model_config
    train = case["mode"] == "train"
    models = measure.fresh_models(lambda: {"m": keras_vit.create_model(
        model_config(case["model"]), num_classes=1000 if train else 0)}, case["precision"])
    model = models["m"]
    rng = np.random.RandomState(0)
    model.set_weights([rng.normal(0, 0.02, w.shape).astype(w.dtype) for w in model.get_weights()])
    config = model_config(case["model"])
    images = rng.uniform(-1, 1, (case["batch"], *config.image_size, config.num_channels)).astype("float32")
    labels = rng.randint(0, 1000, case["batch"])
    call = measure.model_call(model, images, labels, case["mode"])
    for _ in range(3):
        measure.wait_for(call())
    print("ready", flush=True)
"""


class _Worker:
    def __init__(self, checkout):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, checkout, os.path.join(ROOT, "benchmarks", "measure.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=checkout,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"a worker died (exit status {self.proc.wait()}); its stderr is above")
        return answer.strip()

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def _worktree(revision: str) -> str:
    path = tempfile.mkdtemp(prefix="keras_vit_baseline_")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, revision], check=True)
    return path


def main(argv):
    del argv
    import numpy as np

    from keras_vit import hardware

    precisions = [p for p in FLAGS.precisions if p == "float32" or hardware.bf16_instructions()]
    baseline = _worktree(FLAGS.baseline)
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    print(f"this checkout ({head}, with its uncommitted changes) against {FLAGS.baseline} on "
          f"{os.cpu_count()} {hardware.describe()} cores; {FLAGS.rounds} paired rounds per case")
    rows = ["| model | mode | precision | batch | baseline img/s | this img/s | this / baseline |",
            "|---|---|---|---:|---:|---:|---:|"]
    workers = {"baseline": _Worker(baseline), "this": _Worker(ROOT)}
    try:
        for model in FLAGS.models:
            for mode in FLAGS.modes:
                for precision in precisions:
                    for batch in (int(b) for b in FLAGS.batch_sizes):
                        case = {"model": model, "mode": mode, "precision": precision, "batch": batch,
                                "calls": FLAGS.calls}
                        print(f"{model} {mode} {precision} batch {batch}: building...", flush=True)
                        for w in workers.values():
                            w.ask(json.dumps(case))
                        times = {"baseline": [], "this": []}
                        for r in range(FLAGS.rounds):
                            order = ["baseline", "this"] if r % 2 == 0 else ["this", "baseline"]
                            for name in order:
                                times[name].append(float(workers[name].ask("time")))
                        estimate = measure.speedup(times["baseline"], times["this"])
                        base_ips, this_ips = (batch / np.min(times[k]) for k in ("baseline", "this"))
                        row = (f"| {model} | {mode} | {precision} | {batch} | {base_ips:.1f} "
                               f"| {this_ips:.1f} | {measure.format_speedup(estimate)} |")
                        rows.append(row)
                        print(row, flush=True)
    finally:
        for w in workers.values():
            w.close()
        subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", baseline], check=False)
    print("\n".join(rows))


if __name__ == "__main__":
    app.run(main)
