"""Step 3, stage 6: AIMET recovery (CLE, AdaRound, AMP) meets the KPI on the HTP where mixed precision did not;
skipped saying why when --aimet off, the aimet extra is missing, or (auto) an earlier step met the KPI."""

import allure
import pytest


@pytest.mark.step("aimet")
def test_aimet(aimet, check):
    for name, path in (aimet.value.artifacts.items() if aimet.value is not None else ()):
        if path.suffix == ".html" and path.is_file():  # AIMET's per-layer sensitivity reports
            allure.attach.file(str(path), name=f"aimet {name}", attachment_type=allure.attachment_type.HTML)
    report = check(aimet)
    assert report.kpis["met_threshold"]
    assert report.artifacts["encodings"].is_file()
