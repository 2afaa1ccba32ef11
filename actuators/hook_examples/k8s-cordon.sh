#!/bin/sh
# clocktower drain hook for Kubernetes: cordons the node (no new pods are scheduled on it; running pods stay).
# Add `kubectl drain` with your own eviction flags if pods must move off at once.
# Configure: CLOCKTOWER_ACTUATOR_DRAIN_HOOK=/path/to/k8s-cordon.sh
# Called without a shell as: k8s-cordon.sh ACTION NODE TARGET PARAMS_JSON (also in CLOCKTOWER_* variables).
# TARGET is the node to cordon (the command's node when empty); needs a kubeconfig allowed to patch nodes.
set -eu
NODE="${3:-$2}"
exec kubectl cordon -- "$NODE"
