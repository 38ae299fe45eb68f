"""Reporting: the step record and its serialiser (records), the Allure naming contract (names), Allure results
(allure), the offline report command (report_cli), the terminal summary (summary) and the charts (charts)."""
