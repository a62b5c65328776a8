# A sitemesh peer image: CPU, CUDA or ROCm torch by build argument. scripts/containers/sitemesh.def
# builds the same image with Apptainer for HPC sites (both install torch with the same script).
#   docker build -t sitemesh:cpu .
#   docker build --build-arg ACCELERATOR=cuda -t sitemesh:cuda .    # CUDA 12.8 wheels
#   docker build --build-arg ACCELERATOR=rocm -t sitemesh:rocm .    # ROCm 6.4 wheels
#   docker build --build-arg ACCELERATOR=rocm --build-arg TORCH_INDEX=https://download.pytorch.org/whl/rocm6.3 .
#   docker run --rm -p 7001:7001 -v $PWD/certs:/certs sitemesh:cpu peer serve --site a --listen 0.0.0.0:7001 --certs /certs
# Linted by hadolint in the test command (tests/unit/test_containers.py).
FROM python:3.11-slim

ARG ACCELERATOR=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=""

ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/sitemesh

# torch first, in its own layer: it is most of the image and changes least often.
COPY scripts/containers/install-torch.sh /usr/local/bin/install-torch.sh
RUN install-torch.sh "${ACCELERATOR}" "${TORCH_VERSION}" "${TORCH_INDEX}"

# Editable: the shipped corpus and tokenizer (data/) are found next to the sources.
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY data ./data
COPY peer ./peer
COPY ops ./ops
RUN python -m pip install --no-cache-dir -e . \
    && useradd --create-home --uid 1000 sitemesh

USER 1000
# gRPC (peer serve --listen) and Prometheus metrics (--metrics-listen).
EXPOSE 7001 9101
ENTRYPOINT []
CMD ["peer", "--help"]
