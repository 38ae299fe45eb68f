"""Who a run is, as the results database records it: its start, the harness's run id, the host, the CI job
(as the Allure executor reads it), the environment and toolchain, and per model its content digest, its spec
and the git commit and branch of the repository its file is in."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import BaseModel

from harness.baseline import model_sha256
from harness.cache import ArtifactCache
from harness.errors import HarnessError
from harness.files import content_digest
from harness.history.store import RUN_EVENT
from harness.json_values import json_safe
from harness.models import ModelSpec
from harness.reporting.report_cli import executor_info
from harness.target import Target
from harness.versions import tool_versions, toolchain_versions

GIT_TIMEOUT_S = 5.0


class GitRevision(NamedTuple):
    commit: str
    branch: str | None  # None: a detached HEAD
    repository: str


def git_revision(path: Path) -> GitRevision | None:
    """Return the commit and branch checked out in the git work tree holding path (a file or a folder), or None
    when it is in none (or git is not installed, or does not answer within GIT_TIMEOUT_S)."""
    directory = path if path.is_dir() else path.parent
    try:
        proc = subprocess.run(["git", "-C", str(directory), "rev-parse", "--show-toplevel", "HEAD",
                               "--abbrev-ref", "HEAD"], capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) < 3:
        return None
    return GitRevision(lines[1].strip(), None if lines[2].strip() == "HEAD" else lines[2].strip(), lines[0].strip())


def model_file(spec: ModelSpec) -> Path | None:
    """Return the user's file of a model (its ONNX file, or a language model's spec file); None for a built-in
    one."""
    if spec.is_zoo:
        return None
    return spec.path if spec.path is not None else Path(spec.source)


def model_digest(spec: ModelSpec, cache: ArtifactCache, built: bool = False) -> str | None:
    """Return the model's content digest: an ONNX model's sha256 as baselines record it
    (harness.baseline.model_sha256), a language model's over the files its spec names; None for a built-in
    model unless built (the run is over: it was built if a step needed it; before, a worker may be building it),
    and when the files cannot be read."""
    if spec.is_zoo and not built:
        return None
    try:
        if spec.is_llm:
            if spec.is_zoo or spec.llm is None:
                return None
            files = [p for p in (spec.llm.checkpoint, spec.llm.prefill, spec.llm.decode, spec.llm.tokenizer) if p]
            files = [f for p in files for f in (sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p])]
            return hashlib.sha256("\0".join(content_digest(f) for f in files).encode()).hexdigest()
        if spec.is_zoo and not (cache.root / "zoo" / spec.name).is_dir():
            return None
        return model_sha256(spec, cache)
    except (HarnessError, OSError):
        return None


def spec_json(spec: ModelSpec) -> dict[str, Any]:
    """Return the model's spec as plain JSON (thresholds, evaluation, input shapes, frozen inputs, rewrites...)."""
    return json_safe(_plain(spec))


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def run_event(harness_run: str, started_at: str, targets: Sequence[Target], cache: ArtifactCache,
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Return the start event of a run (a new uid) over targets: its identity and its models'."""
    models, revisions = [], {}
    for spec in {t.model.name: t.model for t in targets}.values():
        file = model_file(spec)
        if file is not None and file.parent not in revisions:
            revisions[file.parent] = git_revision(file)
        rev = revisions.get(file.parent) if file is not None else None
        models.append({"model": spec.name, "digest": model_digest(spec, cache), "kind": spec.kind,
                       "source": spec.source, "spec": spec_json(spec), "git_commit": rev.commit if rev else None,
                       "git_branch": rev.branch if rev else None, "git_repository": rev.repository if rev else None})
    first = next((m for m in models if m["git_commit"]), {})
    ci = executor_info("run history", env)
    local = ci.get("type") == "local"
    return {"event": RUN_EVENT, "uid": uuid.uuid4().hex, "harness_run": harness_run, "started_at": started_at,
            "host": socket.gethostname(), "git_commit": first.get("git_commit"), "git_branch": first.get("git_branch"),
            "ci_name": None if local else ci.get("name"), "ci_job": None if local else ci.get("buildName"),
            "ci_url": None if local else ci.get("buildUrl"), "environment": tool_versions(),
            "toolchain": toolchain_versions(), "models": models}


def missing_digests(start: dict[str, Any], targets: Sequence[Target], cache: ArtifactCache) -> dict[str, str]:
    """Return {model: digest} of the models the start event has no digest for that have one now, at the run's
    end (a built-in model built during the run)."""
    missing = {m["model"] for m in start.get("models", []) if not m.get("digest")}
    specs = {t.model.name: t.model for t in targets if t.model.name in missing}
    found = {name: model_digest(spec, cache, built=True) for name, spec in specs.items()}
    return {k: v for k, v in found.items() if v}
