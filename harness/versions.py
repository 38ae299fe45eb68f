"""Versions of the harness and of the tools it runs on, as a run records them."""

from __future__ import annotations

import platform
from importlib import metadata

HARNESS_PACKAGE = "snapdragon-onboarding-harness"


def package_version(name: str) -> str | None:
    """Return the installed version of distribution name, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def harness_version() -> str | None:
    """Return the installed harness's version (None when it is run from a source tree that is not installed)."""
    return package_version(HARNESS_PACKAGE)


def bundled_qnn_version() -> str | None:
    """Return the QNN SDK (QAIRT) version onnxruntime-qnn was built with and ships, or None without it."""
    try:
        from onnxruntime_qnn import build_and_package_info  # type: ignore[import-not-found]
    except ImportError:
        return None
    return getattr(build_and_package_info, "qnn_version", None)


TOOLCHAIN_PACKAGES = ("onnxruntime", "onnxruntime-qnn", "onnx", "onnxslim", "numpy", "aimet-onnx")


def toolchain_versions() -> dict[str, str | None]:
    """Return the versions of what turns a model into figures (onnxruntime, onnxruntime-qnn and the QNN SDK it
    bundles, onnx, onnxslim, numpy, AIMET; None for what is not installed), by distribution name: what a
    baseline records, so that a later run on another toolchain can say so."""
    return {**{name: package_version(name) for name in TOOLCHAIN_PACKAGES}, "qnn-sdk": bundled_qnn_version()}


def tool_versions() -> dict[str, str | None]:
    """Return this machine's versions of the harness, onnxruntime, onnxruntime-qnn, the QNN SDK that
    onnxruntime-qnn bundles, Python and the platform (None for what is not installed)."""
    return {"harness_version": harness_version(), "onnxruntime": package_version("onnxruntime"),
            "onnxruntime_qnn": package_version("onnxruntime-qnn"), "qnn_sdk": bundled_qnn_version(),
            "python": platform.python_version(), "platform": platform.platform()}
