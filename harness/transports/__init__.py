"""Transports: how the harness reaches a device's filesystem and runs commands on it."""

from harness.transports.base import CommandResult, PushResult, Transport, open_transport

__all__ = ["CommandResult", "PushResult", "Transport", "open_transport"]
