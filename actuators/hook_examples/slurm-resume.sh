#!/bin/sh
# clocktower hook for Slurm: puts a node (back) into scheduling. Use it as the spare hook (a spare from the pool
# joins) or as the undrain hook (a drained node returns after repair).
# Configure: CLOCKTOWER_ACTUATOR_SPARE_HOOK=/path/to/slurm-resume.sh and/or CLOCKTOWER_ACTUATOR_UNDRAIN_HOOK (run by
# `clocktower control undrain NODE`)
# Called without a shell as: slurm-resume.sh ACTION NODE TARGET PARAMS_JSON (also in CLOCKTOWER_* variables).
# A spare command is sent to the spare's own actuator: NODE is the spare, the node to resume.
set -eu
NODE="$2"
exec scontrol update "nodename=$NODE" state=resume
