"""Onboarding steps: plain functions from artifacts to artifacts and a StepReport of KPIs."""

from harness.steps.report import StepReport

__all__ = ["StepReport"]
