"""TF Serving's batching parameters: the rule that chooses them, the file, and its writers."""

import functools
import math
import os
import re
import subprocess
import sys

import pytest
from conftest import data_path
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf import wrappers_pb2  # noqa: F401  (registers Int64Value in the default pool)

import keras_vit
from keras_vit import batching, hardware
from keras_vit.export import export_saved_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def batching_parameters_message():
    """TF Serving's `BatchingParameters` (session_bundle_config.proto, fields 1-4), which
    the tensorflow-serving-api package does not ship, built from its field numbers."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(descriptor_pb2.FileDescriptorProto.FromString(
        wrappers_pb2.DESCRIPTOR.serialized_pb).SerializeToString())
    proto = descriptor_pb2.FileDescriptorProto(name="batching.proto", package="tensorflow.serving",
                                               dependency=["google/protobuf/wrappers.proto"])
    message = proto.message_type.add(name="BatchingParameters")
    for number, name in enumerate(("max_batch_size", "batch_timeout_micros", "max_enqueued_batches",
                                   "num_batch_threads"), start=1):
        message.field.add(name=name, number=number, type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                          type_name=".google.protobuf.Int64Value",
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL)
    pool.Add(proto)
    descriptor = pool.FindMessageTypeByName("tensorflow.serving.BatchingParameters")
    if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.21; 3.20 has only the factory
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def parse(text):
    return text_format.Parse(text, batching_parameters_message()())


def measured_latencies(text):
    """batch size -> seconds, from the comment table of a batching_parameters.txt."""
    rows = re.findall(r"^#\s+(\d+)\s+([\d.]+)\s+[\d.]+$", text, re.M)
    return {int(b): float(ms) / 1e3 for b, ms in rows}


def test_the_knee_is_the_smallest_batch_with_nine_tenths_of_the_best_throughput():
    # 10 ms of fixed cost per call and 1 ms per image: images/s grows toward 1000.
    latencies = {b: 0.010 + 0.001 * b for b in batching.BATCH_SIZES}
    params = batching.choose(latencies, num_cores=2)
    assert params.max_batch_size == 64  # 864 images/s; 128 gives 927, and 32 only 762
    assert params.batch_timeout_micros == 0 and params.num_batch_threads == 2
    assert params.max_enqueued_batches == math.ceil(batching.QUEUE_SECONDS / 0.074)


def test_no_batching_gain_keeps_batches_of_one_and_a_deep_queue():
    latencies = {b: 0.02 * b for b in (1, 2, 4, 8)}  # every image costs the same alone or batched
    params = batching.choose(latencies, num_cores=8)
    assert params.max_batch_size == 1 and params.num_batch_threads == 8
    assert params.max_enqueued_batches == 50  # a second of 20 ms calls
    slow = batching.choose({1: 3.0}, num_cores=4)
    assert slow.max_enqueued_batches == 4  # never fewer batches than threads
    serial = batching.choose(latencies, num_cores=8, concurrent_calls=False)
    assert serial.num_batch_threads == 1 and serial.max_enqueued_batches == 50


def test_bad_latencies_and_parameters_are_refused():
    for bad in ({}, {0: 0.1}, {1: 0.0}, {2: -1.0}):
        with pytest.raises(ValueError, match="latencies must map"):
            batching.choose(bad, 2)
    with pytest.raises(ValueError, match="max_batch_size must be an integer >= 1, got 0"):
        batching.BatchingParameters(0, 0, 1, 1)
    with pytest.raises(ValueError, match="batch_timeout_micros must be an integer >= 0, got -1"):
        batching.BatchingParameters(1, -1, 1, 1)


def test_the_text_is_tf_servings_message():
    params = batching.BatchingParameters(max_batch_size=16, batch_timeout_micros=0, max_enqueued_batches=7,
                                         num_batch_threads=2)
    message = parse(params.to_text())
    assert (message.max_batch_size.value, message.batch_timeout_micros.value,
            message.max_enqueued_batches.value, message.num_batch_threads.value) == (16, 0, 7, 2)
    assert message.HasField("batch_timeout_micros")  # written, not left to the server's default


def test_timing_stops_past_the_time_limit_and_behind_the_knee(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(batching.time, "perf_counter", lambda: clock[0])

    def serve_with(cost):
        def serve(batch):
            clock[0] += cost(int(batch.shape[0]))
        return serve

    # Throughput flat from 4 on: 8 and 16 add under 5%, so 32 and beyond are not timed.
    times = batching.time_batches(serve_with(lambda b: 0.04 if b <= 4 else 0.01 * b), b"x")
    assert sorted(times) == [1, 2, 4, 8, 16]
    assert times[4] == pytest.approx(0.04)
    # Throughput still growing, but a call over the limit is the last one timed.
    times = batching.time_batches(serve_with(lambda b: 0.4 + 0.05 * b), b"x", max_seconds=1.5)
    assert sorted(times) == [1, 2, 4, 8, 16, 32]


def test_export_tunes_the_served_model_and_writes_the_file_beside_models_config(tmp_path):
    model = keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz"))
    export_saved_model(model, str(tmp_path / "tiny"), warmup=False)
    text = (tmp_path / "batching_parameters.txt").read_text()
    assert text.startswith(f"# Measured for tiny version 1 on {batching.cores()} ")
    latencies = measured_latencies(text)
    assert list(latencies)[:3] == [1, 2, 4]
    # The numbers written are the rule's, applied to the times measured (as written, to the microsecond).
    expected = batching.choose(latencies, batching.cores(), concurrent_calls=not hardware.onednn_runs())
    assert parse(text) == parse(expected.to_text())
    export_saved_model(model, str(tmp_path / "other"), warmup=False, tune_batching=False)
    assert (tmp_path / "batching_parameters.txt").read_text() == text


def test_the_cli_retunes_an_exported_model_for_the_machine_at_hand(tmp_path):
    model = keras_vit.create_model(None, weights=data_path("vit_tiny_token_rep.npz"))
    version = export_saved_model(model, str(tmp_path / "serving" / "tiny"), warmup=False, tune_batching=False)
    proc = subprocess.run([sys.executable, "-m", "keras_vit.batching", f"--saved_model={version}",
                           f"--output_dir={tmp_path / 'server'}"], env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "server" / "batching_parameters.txt"
    assert re.search(r"^batch    1: +[\d.]+ ms, +[\d.]+ images/s$", proc.stdout, re.M)
    assert proc.stdout.endswith(
        f"Wrote {out}; serve with --enable_batching --batching_parameters_file={out}\n")
    threads = 1 if hardware.onednn_runs() else batching.cores()  # one where TF's oneDNN runs
    assert parse(out.read_text()).num_batch_threads.value == threads
    assert not (tmp_path / "serving" / "batching_parameters.txt").exists()


def test_the_text_reads_back():
    params = batching.BatchingParameters(32, 0, 9, 4)
    assert batching.BatchingParameters.from_text("# a comment\n" + params.to_text()) == params
    with pytest.raises(ValueError, match="no num_batch_threads in the batching parameters"):
        batching.BatchingParameters.from_text(params.to_text().replace("num_batch_threads", "x"))
