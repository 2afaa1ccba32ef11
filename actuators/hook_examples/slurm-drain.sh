#!/bin/sh
# clocktower drain hook for Slurm: takes the node out of scheduling (running jobs finish, no new ones start).
# Configure: CLOCKTOWER_ACTUATOR_DRAIN_HOOK=/path/to/slurm-drain.sh
# Called without a shell as: slurm-drain.sh ACTION NODE TARGET PARAMS_JSON (also in CLOCKTOWER_* variables).
# TARGET is the node to drain (the command's node when empty). Needs scontrol and a Slurm operator's rights.
set -eu
NODE="${3:-$2}"
REASON="clocktower ${CLOCKTOWER_INCIDENT_ID:-manual} (command ${CLOCKTOWER_COMMAND_ID:-?})"
exec scontrol update "nodename=$NODE" state=drain "reason=$REASON"
