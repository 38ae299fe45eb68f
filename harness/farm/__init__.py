"""The device farm: one user of a device at a time (locks.py), a health check before first use (health.py), quarantine
in the farm state file (state.py), and the cooldown before a measurement (cooldown.py)."""
