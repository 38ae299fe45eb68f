"""Step 7, validation: the deployable context binary keeps the task metric on the device over the whole
evaluation set."""

import pytest

pytestmark = pytest.mark.validation


@pytest.mark.step("validation_accuracy")
def test_validation_accuracy(validation_accuracy, check):
    report = check(validation_accuracy)
    assert report.kpis["runtime"] == "htp" and report.kpis["samples"] > 0
