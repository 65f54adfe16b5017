#!/usr/bin/env python
"""What a Beam SDK container's boot program does, for the tests' EXTERNAL worker pool.

On a cluster the pool runs `boot` (`/opt/apache/beam/boot` in the TFX image) for each
worker: it asks the runner's provision service for the job's pipeline options and
starts `sdk_worker_main` with them, which configures Beam's filesystems (S3's endpoint)
and imports the job's `--beam_plugin`s. Beam's own worker pool, without a boot
program, starts bare workers that get neither, so the tests start it with this one.
Staging artifacts, which boot also does, is left out: the workers' environment already
holds the project.

Usage (as the pool calls it): beam_boot.py --id=ID --provision_endpoint=HOST:PORT ...
"""

import argparse
import os
import sys

import grpc
from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc
from google.protobuf import json_format


def main():
    parser = argparse.ArgumentParser()
    for name in ("id", "logging_endpoint", "artifact_endpoint", "provision_endpoint", "control_endpoint"):
        parser.add_argument(f"--{name}", required=True)
    args = parser.parse_args()
    with grpc.insecure_channel(args.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", args.id)]).info
    env = dict(
        os.environ, WORKER_ID=args.id, PIPELINE_OPTIONS=json_format.MessageToJson(info.pipeline_options),
        CONTROL_API_SERVICE_DESCRIPTOR=f'url: "{args.control_endpoint}"',
        LOGGING_API_SERVICE_DESCRIPTOR=f'url: "{args.logging_endpoint}"',
        RUNNER_CAPABILITIES=" ".join(info.runner_capabilities))
    os.execvpe("python", ["python", "-m", "apache_beam.runners.worker.sdk_worker_main"], env)


if __name__ == "__main__":
    sys.exit(main())
