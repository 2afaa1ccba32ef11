"""Shared runtime helpers: what the services (producers, streams, sinks, control, actuators) and the CLI both need.

This layer sits just above schemas/ and imports nothing from the services or the `clocktower` CLI modules
(an import-linter contract in pyproject.toml enforces it), so that each service stays runnable on its own.
"""
