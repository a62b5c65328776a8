#!/usr/bin/env bash
# Installs the torch build of an image variant; shared by the Dockerfile and sitemesh.def so both
# build the same image.
#   install-torch.sh ACCELERATOR [TORCH_VERSION] [INDEX_URL]
# ACCELERATOR: cpu | cuda | rocm. INDEX_URL overrides the wheel index (another CUDA or ROCm release).
# SITEMESH_DRY_RUN=1 prints the pip command instead of running it (tests/unit/test_containers.py).
set -euo pipefail
accelerator=${1:?usage: install-torch.sh cpu|cuda|rocm [TORCH_VERSION] [INDEX_URL]}
version=${2:-2.13.0}
case "$accelerator" in
  cpu)  index=https://download.pytorch.org/whl/cpu ;;
  cuda) index=https://download.pytorch.org/whl/cu128 ;;
  rocm) index=https://download.pytorch.org/whl/rocm6.4 ;;
  *) echo "install-torch.sh: ACCELERATOR must be cpu, cuda or rocm, got '$accelerator'" >&2; exit 2 ;;
esac
cmd=(python -m pip install --no-cache-dir --index-url "${3:-$index}" "torch==$version")
if [[ "${SITEMESH_DRY_RUN:-}" == 1 ]]; then
  echo "${cmd[*]}"
else
  "${cmd[@]}"
fi
