# One image for every ADC process; docker-compose.yml picks the command.
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0 PYTHONUNBUFFERED=1
WORKDIR /opt/adc
# torch first and pinned: the service image needs only the CPU build; GPU workers use the cuda image below.
ARG TORCH_SPEC="torch==2.13.0"
RUN pip install --no-cache-dir "$TORCH_SPEC"
COPY pyproject.toml README.md ./
COPY shared shared
COPY services services
COPY worker worker
COPY cli cli
COPY migrations migrations
COPY adc_config.yaml ./
RUN pip install --no-cache-dir -e .
ENTRYPOINT []
