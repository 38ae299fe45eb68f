"""One exception hierarchy for the harness. Every message says what is wrong and what to do."""

from __future__ import annotations


class HarnessError(Exception):
    """Root of every error the harness raises on purpose."""


class ConfigError(HarnessError):
    """A devices file, model spec or command-line option is malformed."""


class EvaluationError(ConfigError):
    """A model's task evaluation cannot be computed: labels that do not match the samples or do not parse, a
    post-processing that raises, a charset that does not fit the output."""


class ModelError(HarnessError):
    """A model file is missing, is not ONNX, or cannot be prepared (e.g. an unfixed dynamic dim)."""


class TransportError(HarnessError):
    """A command, push or pull on a device failed.

    Carries the device id, the argv, exit code and output so a user can reproduce it.
    """

    def __init__(self, message: str, *, device: str = "", argv: list[str] | None = None,
                 rc: int | None = None, stdout: str = "", stderr: str = "") -> None:
        self.device = device
        self.argv = list(argv or [])
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        detail = message
        if device:
            detail = f"[{device}] {detail}"
        if rc is not None:
            detail += f" (exit code {rc})"
        tail = stderr.strip().splitlines()[-5:] if stderr else []
        if tail:
            detail += "\n  stderr: " + "\n  stderr: ".join(tail)
        super().__init__(detail)


class DeviceTimeoutError(TransportError):
    """A command on a device ran past its timeout."""


class RunnerError(TransportError):
    """The device-side runner failed (model did not load, inputs malformed, ...)."""


class TransientTransportError(TransportError):
    """A connection-level failure that may go away when retried (connection reset, device offline)."""


class DeviceLostError(TransportError):
    """The device disconnected or stopped answering; it is taken out of the session."""


class DeviceQuarantinedError(DeviceLostError):
    """The device is quarantined (failed its health check, or an earlier run put it in the farm state file)."""


class HostKeyError(TransportError):
    """An SSH host key is unknown or has changed; the message says how to trust it."""


class SocMismatchError(ConfigError):
    """The device reports a different SoC than its devices.yaml entry says."""


class FarmError(HarnessError):
    """The farm state file cannot be read or written, or a device lock cannot be taken."""


class StepError(HarnessError):
    """An onboarding step could not produce its artifact."""


class ContextMismatchError(HarnessError):
    """A context binary was compiled for another SoC than the device it was about to run on."""


def is_infrastructure(error: BaseException) -> bool:
    """Return True for an error of the test bench rather than of the model: a device command that ran past
    its timeout, a lost or quarantined device, a connection that dropped, an unknown host key. A step
    stopped by one is recorded `error` (Allure's `broken`), not `failed`: it says nothing of the model."""
    return isinstance(error, (DeviceTimeoutError, DeviceLostError, TransientTransportError, HostKeyError))
