#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine, then runs the fast tests and a bounded
# simulator sweep. Extra arguments go to pytest (e.g. scripts/test.sh tests/unit -x).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/setup_slurm_packages.sh
export PYTHONUNBUFFERED=1
# Static checks first (seconds): lint, types, the layer contract (pyproject.toml), the Dockerfile.
.venv/bin/ruff check .
.venv/bin/mypy peer ops
.venv/bin/lint-imports
.venv/bin/hadolint Dockerfile
exec .venv/bin/python -m pytest -q -p no:cacheprovider --durations=25 "$@"
