"""The device farm: per-device locks, the health check before first use, quarantine in the farm state file, and the
cooldown before a measurement."""
