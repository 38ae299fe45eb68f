"""Accuracy KPIs with their 95 % intervals: the interval maths against scipy and published values, and the
verdicts they give on the real HTP simulator (a limit fails only when the interval lies beyond it)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binomtest

from harness import stats
from harness.data import Dataset
from harness.kpi import Interval, Limit, check_all
from harness.models import Thresholds, resolve_model
from harness.pipeline import Onboarding, Target
from harness.steps.inference import accuracy_limits
from harness.steps.ptq import accuracy_intervals, best_case, resolution_note, resolvable_drop
from harness.steps.report import StepReport


# ------------------------------------------------------------------------------ interval maths


@pytest.mark.parametrize("successes,n", [(0, 8), (7, 8), (5, 8), (33, 33), (350, 360), (1, 200)])
def test_wilson_matches_scipy_and_the_closed_form(successes, n):
    ci = binomtest(successes, n).proportion_ci(confidence_level=0.95, method="wilson")
    interval = stats.wilson(successes, n)
    assert (interval.low, interval.high) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert stats._wilson_bounds(successes / n, n, stats._z(0.95)) == pytest.approx((ci.low, ci.high), abs=1e-9)
    assert interval.samples == n and interval.method == "wilson"


def test_a_drop_of_an_agreement_is_its_complement():
    agreement = stats.wilson(7, 8)  # the PaddleOCR classifier: 7 of 8 agree
    drop = stats.complement(agreement)
    assert (drop.low, drop.high) == pytest.approx((1 - agreement.high, 1 - agreement.low))
    assert drop.low == pytest.approx(0.0224, abs=1e-4) and drop.high == pytest.approx(0.4709, abs=1e-4)


def test_samples_needed_for_a_two_percent_drop():
    # no disagreement: the Wilson upper bound z²/(n + z²) is <= 0.02 from n = 189 on
    assert stats.proportion_needed(0.0, 0.02) == 189
    assert stats.resolvable_drop(189) <= 0.02 < stats.resolvable_drop(188)
    assert stats.resolvable_drop(8) == pytest.approx(0.3244, abs=1e-4)
    assert stats.proportion_needed(0.02, 0.02) is None  # on the bound: no count resolves it
    low, _ = stats._wilson_bounds(0.05, stats.proportion_needed(0.05, 0.02), stats._z(0.95))
    assert low > 0.02  # the count found does resolve a 5 % disagreement as a failure


def test_newcombe_paired_difference_matches_the_published_value():
    # Fagerland, Lydersen & Laake, "Statistical analysis of contingency tables", ch. 8 (Cavo et al. 2012):
    # the table [[59, 6], [16, 80]] gives -0.0621 (95% CI -0.1186 to -0.0046) by Newcombe's square-and-add method
    a = [True] * 59 + [True] * 6 + [False] * 16 + [False] * 80
    b = [True] * 59 + [False] * 6 + [True] * 16 + [False] * 80
    interval = stats.difference_of_proportions(a, b)
    assert (interval.low, interval.high) == pytest.approx((-0.1186, -0.0046), abs=5e-5)
    assert interval.method == "newcombe" and interval.samples == 161


def test_no_changed_sample_is_not_proof_on_few_samples():
    # a bootstrap would give [0, 0] here; Newcombe's interval keeps the width 8 samples leave
    same = [True] * 8
    interval = stats.difference_of_proportions(same, same)
    assert interval.low < 0 < 0.02 < interval.high
    assert stats.difference_of_proportions([True] * 350 + [False] * 10, [True] * 350 + [False] * 10).high < 0.02


def test_newcombe_covers_the_true_difference():
    rng = np.random.default_rng(1)
    covered = 0
    trials = 400
    for _ in range(trials):  # float right 90 %, the quantized model loses 3 % of those and fixes 1 % of the rest
        float_ok = rng.random(120) < 0.9
        flip = rng.random(120)
        quant_ok = np.where(float_ok, flip >= 0.03 / 0.9, flip < 0.01 / 0.1)
        interval = stats.difference_of_proportions(float_ok, quant_ok)
        covered += interval.low <= 0.02 <= interval.high
    assert covered / trials >= 0.93


def test_bootstrap_is_reproducible_and_brackets_the_value():
    values = np.linspace(0.9, 1.0, 50)
    a = stats.bootstrap(lambda idx: float(values[idx].mean()), len(values))
    b = stats.bootstrap(lambda idx: float(values[idx].mean()), len(values))
    assert a == b and a.low < values.mean() < a.high and a.method == "bootstrap"


@pytest.mark.parametrize("n", [1, 2, 4, 9, 360])
def test_bootstrap_of_sums_is_the_bootstrap_of_the_resamples_totals(n):
    from harness.metrics import cosine_from_sums, sqnr_from_sums

    rows = np.abs(np.random.default_rng(n).normal(size=(n, 4))) + 0.1
    for statistic, bounds in ((cosine_from_sums, (-1.0, 1.0)), (sqnr_from_sums, None)):
        plain = stats.bootstrap(lambda idx: statistic(rows[idx].sum(axis=0)), n, bounds=bounds)
        fast = stats.bootstrap_of_sums(rows, statistic, bounds=bounds)
        assert (fast.low, fast.high, fast.samples) == pytest.approx((plain.low, plain.high, plain.samples), rel=1e-12)


def test_bootstrap_on_few_samples_is_not_overconfident():
    # a percentile bootstrap covers a mean about half the time on 2 samples and 73 % on 3; the expanded interval
    # is near its nominal 95 % from 5 samples on, and on fewer samples (one included) a statistic resolves nothing:
    # its bounds, or the whole real line for an unbounded one (SQNR, perplexity)
    rng = np.random.default_rng(3)
    covered = 0
    for trial in range(200):
        x = rng.normal(0.0, 1.0, 6)
        interval = stats.bootstrap(lambda idx: float(x[idx].mean()), 6, resamples=400, seed=trial)
        covered += interval.low <= 0.0 <= interval.high
    assert covered / 200 >= 0.9
    two = np.array([0.97, 0.99])
    assert stats.bootstrap(lambda idx: float(two[idx].mean()), 2, bounds=(-1.0, 1.0)) == stats.Interval(
        -1.0, 1.0, 2, "bootstrap", 0.95)
    wide = stats.bootstrap(lambda idx: float(two[idx].mean()), 2)
    assert (wide.low, wide.high) == (-math.inf, math.inf)
    one = stats.bootstrap(lambda idx: float(two[idx].mean()), 1, bounds=(0.0, 1.0))
    assert (one.low, one.high) == (0.0, 1.0)
    assert Limit("sqnr_db", minimum=10.0).check(40.0, wide).inconclusive
    assert stats.samples_needed(wide, 40.0, 10.0) == stats.MIN_BOOTSTRAP_SAMPLES


def test_limits_fail_only_beyond_the_interval_and_say_how_many_samples_would_decide():
    limits = [Limit("task_metric_drop", maximum=0.02)]
    straddling = {"task_metric_drop": 0.0, "intervals": {"task_metric_drop": stats.complement(stats.wilson(12, 12)).as_dict()}}
    beyond = {"task_metric_drop": 0.125, "intervals": {"task_metric_drop": stats.complement(stats.wilson(28, 32)).as_dict()}}
    within = {"task_metric_drop": 0.0, "intervals": {"task_metric_drop": stats.complement(stats.wilson(200, 200)).as_dict()}}
    assert check_all(straddling, limits)[0].state == "inconclusive"
    assert check_all(beyond, limits)[0].state == "failed"
    assert check_all(within, limits)[0].state == "passed"
    [sentence] = stats.unresolved(straddling, limits)
    assert sentence == ("inconclusive: 12 samples cannot resolve a drop of 0.02 (task_metric_drop 0, 95% interval "
                        "[0, 0.2425]); about 189 are needed")
    assert Interval.from_dict(straddling["intervals"]["task_metric_drop"]).needed == 189
    assert stats.unresolved(beyond, limits) == [] and stats.unresolved(within, limits) == []


def test_accuracy_intervals_of_labelled_and_unlabelled_outputs():
    rng = np.random.default_rng(0)
    logits = [rng.normal(size=(1, 10)).astype(np.float32) for _ in range(40)]
    labels = np.array([int(np.argmax(x)) for x in logits])
    noisy = [{"y": x + rng.normal(scale=0.05, size=x.shape).astype(np.float32)} for x in logits]
    reference = [{"y": x} for x in logits]
    unlabelled = Dataset([], [{}] * 40)
    got = accuracy_intervals(noisy, reference, unlabelled)
    agree = sum(int(np.argmax(n["y"]) == np.argmax(r["y"])) for n, r in zip(noisy, reference))
    assert got["task_metric"]["method"] == "wilson" and got["task_metric"]["samples"] == 40
    assert got["task_metric_drop"]["high"] == pytest.approx(1 - stats.wilson(agree, 40).low)
    assert got["cosine_similarity"]["low"] < got["cosine_similarity"]["high"] <= 1.0
    assert got["sqnr_db"]["method"] == "bootstrap" and got["sqnr_db"]["low"] > 10
    labelled = Dataset([], [{}] * 40, labels=labels)
    assert accuracy_intervals(noisy, reference, labelled)["task_metric_drop"]["method"] == "newcombe"
    # the least drop these samples resolve: the drop's upper bound for a model identical to float
    assert (resolvable_drop(best_case(labelled, reference)) == pytest.approx(stats.resolvable_drop(40))
            == resolvable_drop(best_case(unlabelled, reference)))
    limits = accuracy_limits(Thresholds())
    note = resolution_note(best_case(unlabelled, reference), limits, inference_s=0.25)
    assert "40 samples cannot resolve a drop of 0.02 (task_metric_drop 0, 95% interval [0, 0.08762])" in note
    assert "about 189 are needed" in note and "189 samples are about 47 s of device time" in note
    assert resolution_note(best_case(Dataset([], [{}] * 360), reference * 9), limits) is None
    # on fewer samples than a bootstrap can resolve, an unbounded KPI (SQNR) is undecided even for float itself
    few = resolution_note(best_case(Dataset([], [{}] * 3), reference[:3]), limits)
    assert "3 samples cannot resolve sqnr_db >= " in few and "[-inf, inf]" in few and "about 5 are needed" in few


# ------------------------------------------------------------------------------ verdicts on the HTP simulator


def _onboarding(name, devices, runner, cache, **spec):
    dev = devices.select(["sm8650-emu"])[0]
    model = resolve_model(str(name), spec.pop("input_shapes", {}), None)
    return Onboarding(Target(dev, devices.soc(dev.soc), model), runner, cache)


def _interval(report: StepReport, kpi: str) -> Interval:
    return Interval.from_dict(report.kpis["intervals"][kpi])


def test_digits_cnn_default_ptq_passes_decisively(devices, sm8650_runner, cache):
    report = _onboarding("digits_cnn", devices, sm8650_runner, cache).ptq()
    assert report.status in ("passed", "marginal") and report.passed, report.undecided() + report.problems()
    assert report.kpis["samples"] == 360 and report.kpis["task_metric_name"] == "top1_accuracy"
    drop = _interval(report, "task_metric_drop")
    assert drop.method == "newcombe" and drop.samples == 360 and drop.high < 0.02
    assert _interval(report, "cosine_similarity").low >= 0.98 and _interval(report, "sqnr_db").low >= 15
    rows = {r["kpi"]: r for r in report.tables["intervals"]}
    assert rows["task_metric_drop"]["n"] == 360 and rows["task_metric_drop"]["high"] == drop.high


def test_a_planted_bad_quantization_fails_decisively(devices, sm8650_runner, cache):
    # digits_imbalanced: the same network with channels rescaled so 8-bit per-tensor ranges crush them
    report = _onboarding("digits_imbalanced", devices, sm8650_runner, cache).ptq()
    assert report.status == "failed" and not report.undecided()
    drop = _interval(report, "task_metric_drop")
    assert report.kpis["task_metric_drop"] >= 0.05 and drop.low > 0.02, report.kpis
    assert any(p.startswith("FAIL: task_metric_drop") for p in report.problems())


@pytest.mark.real_models
def test_ppocrv5_cls_on_its_rendered_lines_is_inconclusive_not_failed(devices, sm8650_runner, cache):
    from real_models_helpers import real_model_spec

    ob = _onboarding(real_model_spec("ppocrv5_cls"), devices, sm8650_runner, cache)
    report = ob.ptq()  # top-1 on its labelled lines (0 or 180 degrees), judged on the ratio to float
    assert report.status == "inconclusive" and not report.problems(), report.problems()
    ratio = _interval(report, "task_metric_ratio")
    assert ratio.low <= 0.98 < ratio.high and ratio.needed and ratio.needed > ratio.samples
    assert any(s.startswith(f"inconclusive: {ratio.samples} samples cannot resolve task_metric_ratio >= 0.98") and
               s.endswith(f"about {ratio.needed} are needed") for s in report.inconclusive)
    # dependent steps run: error isolation says PTQ could not be decided instead of failing
    isolation = ob.error_isolation()
    assert isolation.status == "inconclusive" and isolation.inconclusive[0].startswith("PTQ could not be decided")
    # nothing decisively beats PTQ's model, so it ships
    assert ob.deployable()[0] in ("ptq", "mixed_precision", "aimet")


@pytest.mark.real_models
def test_ppocrv5_cls_on_random_data_fails_only_on_its_interval(devices, sm8650_runner, cache):
    from real_models_helpers import real_model_path

    ob = _onboarding(real_model_path("ppocrv5_cls"), devices, sm8650_runner, cache,
                     input_shapes={"x": (1, 3, 48, 192)})
    report = ob.ptq()
    drop = _interval(report, "task_metric_drop")
    n = report.kpis["samples"]
    assert drop.samples == n and drop.method == "wilson"
    assert "resolve a drop of an agreement of at best" in report.kpis["dataset"]  # said before any step ran
    expected = "failed" if drop.low > 0.02 else "passed" if drop.high <= 0.02 else "inconclusive"
    assert report.status == expected, (report.kpis, report.problems(), report.undecided())
    if n >= 8:
        # random inputs sit at this classifier's decision boundary (float top-2 probabilities within 0.1), so
        # 8-bit outputs flip some of them: 3 of the first 8 here, about 1 in 9 over more samples. That is a real
        # disagreement rate far above 2 %, which more samples resolve rather than excuse
        assert report.status == "failed" and drop.low > 0.02, report.kpis
    assert _interval(report, "cosine_similarity").low >= 0.98 and _interval(report, "sqnr_db").low >= 15
