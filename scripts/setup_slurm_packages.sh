#!/usr/bin/env bash
# Installs Debian's slurm-wlm and munge for the placement tests (which start their own single-node
# cluster: tests/integration/slurm_cluster.py), nftables for the WAN emulation's delay-line
# redirect (tests/support/netns.py) and tinyproxy, the HTTP CONNECT proxy an outbound site dials its
# relays through in tests/integration/test_relay_mesh.py. Idempotent and quiet; needs root and Debian's package registry;
# without them the Slurm and WAN-emulation tests are skipped with the reason printed.
set -uo pipefail
needed=(munged mungekey slurmctld slurmd sbatch squeue scancel sinfo nft tinyproxy)
have_all() { for b in "${needed[@]}"; do command -v "$b" >/dev/null || return 1; done; }
if have_all; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup_slurm_packages: not root or no apt-get; Slurm tests will be skipped" >&2; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq slurm-wlm munge nftables tinyproxy >/dev/null 2>&1 || echo "setup_slurm_packages: install failed" >&2
have_all || echo "setup_slurm_packages: Slurm/munge/nft/tinyproxy still incomplete; their tests will be skipped" >&2
exit 0
