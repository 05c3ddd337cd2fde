# One image for every ADC process; docker-compose.yml picks the command.
FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0 PYTHONUNBUFFERED=1
WORKDIR /opt/adc
# g++: DeepSpeed compiles its CPU communication op (prebuilt below; a CPU worker needs it at run time).
RUN apt-get update && apt-get install -y --no-install-recommends g++ && rm -rf /var/lib/apt/lists/*
# The trainer's own environment (README.md, "Dependencies"): LLaMA-Factory 0.9.5 and the versions it
# pins, in .venv-trainer, where worker/trainer/interpreter.py looks. Built before ADC's code is
# copied, so a code change does not rebuild its 7 GB. torch first, from the same pins.
COPY worker/trainer/requirements.txt worker/trainer/requirements.txt
RUN python -m venv .venv-trainer \
 && .venv-trainer/bin/pip install --no-cache-dir $(grep -E '^torch(vision|audio)?==' worker/trainer/requirements.txt) \
 && .venv-trainer/bin/pip install --no-cache-dir -r worker/trainer/requirements.txt
# ADC's own environment: torch first and pinned, the CPU build (the services need no CUDA).
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
# What scripts/install.sh does after building the trainer env: the argument schema the api
# validates jobs against (without importing LLaMA-Factory), and DeepSpeed's CPU op.
RUN PYTHONPATH=/opt/adc .venv-trainer/bin/python -m worker.trainer.schema_export \
      --out .venv-trainer/adc_llamafactory_schema.json \
 && mkdir -p .venv-trainer/torch_extensions \
 && PATH=/opt/adc/.venv-trainer/bin:$PATH TORCH_EXTENSIONS_DIR=/opt/adc/.venv-trainer/torch_extensions .venv-trainer/bin/python -c \
      'from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()' \
 && touch .venv-trainer/torch_extensions/.adc-built
ENTRYPOINT []
