"""Loads the harness's pytest plugin for the suites, and pytester for the harness's own tests."""

pytest_plugins = ["harness.plugin", "pytester"]
