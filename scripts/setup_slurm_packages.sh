#!/usr/bin/env bash
# Installs Debian's slurm-wlm and munge for the placement tests (which start their own single-node
# cluster: tests/integration/slurm_cluster.py), nftables for the WAN emulation's delay-line
# redirect (tests/support/netns.py) and tinyproxy, the HTTP CONNECT proxy an outbound site dials its
# relays through in tests/integration/test_relay_mesh.py, and slurmdbd with mariadb-server for the
# tests that start the cluster with accounting (tests/integration/slurm_accounting.py: sacct).
# Idempotent and quiet; needs root and Debian's package registry;
# without them the Slurm and WAN-emulation tests are skipped with the reason printed.
set -uo pipefail
needed=(munged mungekey slurmctld slurmd sbatch squeue scancel sinfo nft tinyproxy)
# Only the accounting tests need these; without them those alone are skipped.
accounting=(slurmdbd mariadbd mariadb-install-db mariadb)
have_all() { for b in "$@"; do command -v "$b" >/dev/null || return 1; done; }
if have_all "${needed[@]}" "${accounting[@]}"; then exit 0; fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "setup_slurm_packages: not root or no apt-get; Slurm tests will be skipped" >&2; exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
apt-get install -y -qq slurm-wlm munge nftables tinyproxy >/dev/null 2>&1 || echo "setup_slurm_packages: install failed" >&2
# slurmdbd is the same Slurm release as slurm-wlm (22.05 on Debian 12). Any system MariaDB or
# slurmdbd service the packages start is left alone: the tests start their own, on free ports.
apt-get install -y -qq slurmdbd mariadb-server >/dev/null 2>&1 || echo "setup_slurm_packages: slurmdbd/mariadb-server install failed" >&2
have_all "${needed[@]}" || echo "setup_slurm_packages: Slurm/munge/nft/tinyproxy still incomplete; their tests will be skipped" >&2
have_all "${accounting[@]}" || echo "setup_slurm_packages: slurmdbd/MariaDB missing; the Slurm accounting tests will be skipped" >&2
exit 0
