#!/usr/bin/env bash
# Make BCC (eBPF) usable from the checkout's venv on a Debian 12 machine (`make setup-ebpf`). Idempotent.
#
#   scripts/setup_bcc.sh [VENV]        (VENV defaults to .venv)
#
# The work is done by producers/agent/ebpf/setup_bcc.sh, which ships in the package (an installed agent runs it
# with `clocktower agent setup-ebpf`); here the kernel headers go into the checkout's .cache/kernel-headers/.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO/$VENV" ;; esac
export CLOCKTOWER_HEADERS_CACHE="${CLOCKTOWER_HEADERS_CACHE:-$REPO/.cache/kernel-headers}"
exec bash "$REPO/producers/agent/ebpf/setup_bcc.sh" "$VENV"
