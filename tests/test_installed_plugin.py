"""The harness as a user installs it: a wheel built from this repository, installed into a fresh virtual
environment, run from a directory outside the repository with `pytest --pyargs harness.suites`."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return the python of a virtual environment with the harness installed from a wheel (its dependencies
    come from this interpreter's site-packages; pip fetches only the build backend from the package index)."""
    root = tmp_path_factory.mktemp("installed")
    wheels = root / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, timeout=600)
    venv.create(root / "venv", system_site_packages=True, with_pip=True)
    python = root / "venv" / "bin" / "python"
    wheel = next(wheels.glob("snapdragon_onboarding_harness-*.whl"))
    subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=600)
    return python


def test_the_installed_plugin_runs_the_packaged_suites_from_any_directory(installed, tmp_path):
    where = subprocess.run([str(installed), "-c", "import harness, harness.suites; print(harness.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert str(installed.parent.parent) in where and str(REPO) not in where  # the wheel's copy, not the repo
    env = {"HARNESS_CACHE_DIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    collect = subprocess.run([str(installed), "-m", "pytest", "--pyargs", "harness.suites", "--device", "sm8650",
                              "--co", "-q", "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True, text=True,
                             env=env, timeout=300)
    assert collect.returncode == 0, collect.stdout + collect.stderr
    suites = len(list((Path(__file__).resolve().parent.parent / "harness" / "suites").glob("test_*.py")))
    assert f"{suites} tests collected" in collect.stdout and "test_sustained[sm8650-emu-digits_cnn]" in collect.stdout
    run = subprocess.run([str(installed), "-m", "pytest", "--pyargs", "harness.suites", "--device", "sm8650",
                          "-k", "feasibility and not llm", "-p", "no:cacheprovider"], cwd=tmp_path, capture_output=True,
                         text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "1 passed" in run.stdout and "device sm8650-emu (sm8650, emulator): healthy" in run.stdout
