#!/usr/bin/env bash
# Wheels the GPU machine lacks (it reaches no package registry), downloaded here into .whl/ (ignored by
# git): pass `carry: [".whl"]` to the device call and scripts/gpu_check.sh's build step installs them.
# llguidance: structured output; starlette, uvicorn, httpx and what they need: `hearth bench --serve`
# (the server is starlette alone: no fastapi or pydantic). typing_extensions: anyio 4.16 and starlette ask
# for >=4.16, newer than torch's may be. platformdirs: the model library's default home (Engine._resolve
# lists the library even for a checkpoint folder), unless HEARTH_HOME is set.
# The versions are those the test environment here resolves (pure Python or abi3: any Python 3.10+).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: -d .whl \
  llguidance==1.9.1 starlette==1.10.0 uvicorn==0.55.0 httpx==0.29.0 httpcore==1.0.9 h11==0.16.0 \
  anyio==4.16.0 sniffio==1.3.1 idna==3.20 certifi==2026.10.19.post1 click==8.5.1 \
  typing_extensions==4.16.0 platformdirs==4.14.9
ls .whl
