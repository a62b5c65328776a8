# A sitemesh peer image. Pass --build-arg TORCH="torch==X" (or a ROCm/CUDA wheel spec) for your site.
#   docker build -t sitemesh .
#   docker run --rm -p 7001:7001 -v $PWD/certs:/certs sitemesh peer serve --site a --listen 0.0.0.0:7001 --certs /certs
FROM python:3.11-slim
ARG TORCH="torch"
WORKDIR /opt/sitemesh
COPY pyproject.toml README.md ./
COPY peer ./peer
COPY ops ./ops
COPY protos ./protos
RUN pip install --no-cache-dir ${TORCH} && pip install --no-cache-dir .
EXPOSE 7001
ENTRYPOINT []
CMD ["peer", "--help"]
