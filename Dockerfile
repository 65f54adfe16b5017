# The pipeline's image for Kubeflow Pipelines and Vertex AI Pipelines: TFX 1.16's own
# image with this project's locked environment and its two packages on the path.
#   docker build -t REGISTRY/keras-vit:TAG .
#   python -m pipeline.run --orchestrator=kubeflow_v2 --kubeflow_image=REGISTRY/keras-vit:TAG ...
# TFX's image is also a Beam SDK container (entrypoint /opt/apache/beam/boot), so the same
# image is a Beam worker pool for Flink or Spark: docker run -p 50000:50000 IMAGE --worker_pool
FROM gcr.io/tfx-oss-public/tfx:1.16.0

WORKDIR /keras-vit
COPY requirements/lock.txt requirements/lock.txt
RUN pip install --no-cache-dir -r requirements/lock.txt
COPY keras_vit keras_vit
COPY pipeline pipeline
ENV PYTHONPATH=/keras-vit
