#!/usr/bin/env bash
# The main job: a local multi-site run on embedded defaults (three sites on this machine).
# Installs what it needs into .venv first. Extra arguments go to `ops demo` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PYTHONUNBUFFERED=1
exec .venv/bin/ops demo "$@"
