"""Who a run is, as the farm's locks, leases and quarantines name it."""

from __future__ import annotations

import functools
import os
import uuid

RUN_ID_VARIABLES = ("HARNESS_RUN_ID", "CI_JOB_ID", "GITHUB_RUN_ID", "BUILD_TAG")


@functools.cache
def run_id() -> str:
    """Return this process's run id: $HARNESS_RUN_ID, else a CI job's id (GitLab, GitHub Actions, Jenkins), else a
    random one. (A pytest-xdist worker takes its controller's, from the plugin.)"""
    for name in RUN_ID_VARIABLES:
        if os.environ.get(name):
            return os.environ[name][:40]
    return uuid.uuid4().hex[:12]
