"""The onboarding suites, one thin module per step (Steps 1-7), shipped with the package.

Run them from any directory with ``pytest --pyargs harness.suites --device sm8650 --model your.onnx``;
the plugin (``harness.plugin``) is registered through the ``pytest11`` entry point when the package is
installed. In the repository, ``suites/`` is a link to this folder (``pytest suites/ --device sm8650``).
"""
