#!/bin/sh
# clocktower hook for Kubernetes: uncordons a node. Use it as the spare hook (a spare node starts taking pods)
# or as the undrain hook (a drained node returns).
# Configure: CLOCKTOWER_ACTUATOR_SPARE_HOOK=/path/to/k8s-uncordon.sh and/or CLOCKTOWER_ACTUATOR_UNDRAIN_HOOK (run by
# `clocktower control undrain NODE`)
# Called without a shell as: k8s-uncordon.sh ACTION NODE TARGET PARAMS_JSON (also in CLOCKTOWER_* variables).
set -eu
NODE="$2"
exec kubectl uncordon -- "$NODE"
