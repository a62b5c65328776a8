#!/usr/bin/env bash
# Idempotent set-up: a virtualenv in .venv with torch, the project and its test tools.
# On CPU machines torch==2.13.0 is installed first from the local wheel so that nothing pulls a
# multi-GB CUDA build; on GPU sites set SITEMESH_TORCH to the torch build you want (or "skip").
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.sitemesh-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    torch_spec=${SITEMESH_TORCH:-torch==2.13.0}
    if [ "$torch_spec" != skip ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
        .venv/bin/pip install -q "$torch_spec"
    fi
    .venv/bin/pip install -q -e ".[test]"
    touch "$stamp"
fi
