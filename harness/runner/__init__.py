"""The device-side runner (device_runner.py, self-contained) and its host-side client."""
