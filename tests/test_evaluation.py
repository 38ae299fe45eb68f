"""The evaluation section of model specs (harness/evaluation/): post-processing, task metrics, labelled folders,
the ratio to float with its interval, and every bad input named (file and line, key, output)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from harness.data import InputInfo
from harness.errors import ConfigError, EvaluationError
from harness.evaluation.datasets import labelled_samples
from harness.evaluation.detection import db_boxes, hmean_parts
from harness.evaluation.metrics import BUILTIN, metric_for
from harness.evaluation.postprocess import CtcGreedy, argmax, read_charset
from harness.evaluation.spec import Evaluation
from harness.evaluation.task import TaskEvaluation
from harness.models import resolve_model
from harness.signoff import build_signoff  # imported before pytester's sys.modules snapshot (numpy.fft reloads)

INFOS = [InputInfo("x", (1, 4), np.float32)]


def one_hot_steps(indices: list[int], classes: int) -> np.ndarray:
    """A (1, steps, classes) CTC output whose best class per step is indices[step]."""
    out = np.full((1, len(indices), classes), 0.01, dtype=np.float32)
    out[0, np.arange(len(indices)), indices] = 0.9
    return out


# ------------------------------------------------------------------------------ post-processing and metrics


def test_charset_keeps_every_character_and_strips_only_line_ends(tmp_path):
    path = tmp_path / "dict.txt"
    path.write_bytes("\u3000\r\na\r\n \r\nb\n".encode())
    assert read_charset(path) == ["\u3000", "a", " ", "b"]


def test_ctc_greedy_collapses_repeats_drops_the_blank_and_reads_the_space_class(tmp_path):
    decode = CtcGreedy(("a", "b", "c"), tmp_path / "dict.txt")
    # classes: 0 blank, 1 a, 2 b, 3 c, 4 space (PaddleOCR's use_space_char)
    assert decode(one_hot_steps([1, 1, 0, 1, 2, 2, 4, 3, 0], 5), "out") == "aab c"
    assert decode(one_hot_steps([3, 0, 3], 4), "out") == "cc"  # no space class: width n + 1


def test_a_charset_that_does_not_fit_the_output_names_both(tmp_path):
    decode = CtcGreedy(("a", "b"), tmp_path / "dict.txt")
    with pytest.raises(EvaluationError, match=r"dict.txt has 2 characters, but output 'logits' has 7 classes "
                                              r"per step: expected 3 .* or 4"):
        decode(one_hot_steps([1], 7), "logits")


def test_built_in_metrics():
    cer = BUILTIN["cer"]
    assert cer.value(["sitting", "abc"], ["kitten", "abc"]) == pytest.approx(3 / 9)  # edits over label characters
    assert cer.ratio(0.1, 0.05) == pytest.approx(0.9 / 0.95)  # ratio of character accuracy (1 - cer)
    assert cer.drop(0.1, 0.05) == pytest.approx(0.05)  # worse by 0.05
    assert BUILTIN["word_accuracy"].value(["hello ", "world"], ["hello", "word"]) == 0.5
    assert BUILTIN["top5"].value([argmax(np.arange(10.0)), argmax(-np.arange(10.0))], [5, 5]) == 0.5
    assert BUILTIN["top1"].value([3, (2, 1)], [3, 1]) == 0.5  # a user post-processing's single class counts too
    assert BUILTIN["top1"].ratio(0.9, 0.95) == pytest.approx(0.9 / 0.95)
    f1 = metric_for(Evaluation(Path("."), Path("l.csv"), "f1", postprocess="frames"))
    # frames: TP 2, FP 1, FN 1 -> 2*2 / (2*2 + 1 + 1)
    assert f1.value([(1, 1, 0, 1), (0, 0)], [f1.parse("1 1 1 0"), f1.parse("0 0")]) == pytest.approx(4 / 6)
    # a wake word's decisions (one frame a sample): 2 of 3 positives found, 1 of 2 negatives accepted
    frames = Evaluation(Path("."), Path("l.csv"), "detection_rate", postprocess="frames")
    found, accepted = metric_for(frames), metric_for(frames, "false_accepts")
    predictions, labels = [(1,), (1,), (0,), (1,), (0,)], [found.parse(y) for y in "1 1 1 0 0".split()]
    assert found.value(predictions, labels) == pytest.approx(2 / 3) and found.higher_is_better
    assert accepted.value(predictions, labels) == pytest.approx(1 / 2) and not accepted.higher_is_better
    assert accepted.value([(0,)], [(1,)]) == 0.0  # no negatives: nothing to accept falsely


def test_db_boxes_finds_each_text_region_grown_as_paddleocr_unclips_it():
    prob = np.zeros((1, 1, 64, 64), np.float32)
    prob[0, 0, 10:16, 8:40] = 0.9  # a text line: 32 x 6 pixels of centers
    prob[0, 0, 30:38, 20:30] = 0.5  # above the binarization threshold, below the box threshold: no text
    prob[0, 0, 50, 5:60] = 0.9  # one row of pixels: no area
    (box,) = db_boxes(prob)
    xs, ys = box[0::2], box[1::2]
    # the region's rectangle (31 x 5 between pixel centers) grown by area x 1.5 / perimeter = 2.16 on each side
    # (pyclipper offsets integer paths, as in PaddleOCR: within a pixel)
    assert min(xs) == pytest.approx(8 - 2.16, abs=1) and max(xs) == pytest.approx(39 + 2.16, abs=1)
    assert min(ys) == pytest.approx(10 - 2.16, abs=1) and max(ys) == pytest.approx(15 + 2.16, abs=1)
    assert db_boxes(np.zeros((64, 64))) == ()


def test_hmean_matches_boxes_one_to_one_at_iou_one_half():
    hmean = BUILTIN["hmean"]
    truth = hmean.parse("0 0 10 0 10 10 0 10; 20 0 30 0 30 10 20 10")
    assert truth == ((0, 0, 10, 0, 10, 10, 0, 10), (20, 0, 30, 0, 30, 10, 20, 10)) and hmean.parse("") == ()
    shifted = (3, 0, 13, 0, 13, 10, 3, 10)  # IoU 7/13 with the first box
    far = (0, 3, 10, 3, 10, 13, 0, 13)[:2] + (6, 3, 16, 3, 16, 13, 6, 13)[2:]  # a skewed quad, IoU < 0.5 with both
    assert hmean_parts([shifted, shifted], truth) == (2.0, 4.0)  # one match: the second copy is a false positive
    assert hmean.value([(shifted,), (far,)], [truth[:1], truth[1:]]) == pytest.approx(2 / 4)
    assert hmean.value([()], [()]) == 1.0  # nothing to find and nothing found
    assert hmean.higher_is_better and hmean.ratio(0.76, 0.8) == pytest.approx(0.95)
    with pytest.raises(ValueError):
        hmean.parse("0 0 10 0 10 10")


# ------------------------------------------------------------------------------ labelled folders


def labelled_folder(tmp_path: Path, rows: list[str], samples=("a.npy", "b.npy"), metric="top1") -> Evaluation:
    data = tmp_path / "eval"
    data.mkdir(exist_ok=True)
    for name in samples:
        np.save(data / name, np.ones((1, 4), dtype=np.float32))
    (tmp_path / "labels.csv").write_text("\n".join(["file,label", *rows]) + "\n")
    return Evaluation(data, tmp_path / "labels.csv", metric, spec=tmp_path / "spec.yaml")


def test_a_labelled_folder_loads_in_the_csv_order(tmp_path):
    feeds, labels, task = labelled_samples(labelled_folder(tmp_path, ["b.npy,1", "a.npy,0"]), INFOS)
    assert len(feeds) == 2 and labels == ["1", "0"] and task.samples == ("b.npy", "a.npy")


@pytest.mark.parametrize("rows, samples, metric, message", [
    (["a.npy,0", "c.npy,1"], ("a.npy",), "top1", r"labels\.csv, line 3: 'c.npy' is not a sample file"),
    (["a.npy,0"], ("a.npy", "b.npy"), "top1", r"1 sample file\(s\) have no label in .*labels\.csv: b\.npy"),
    (["a.npy,0", "b.npy,cat"], ("a.npy", "b.npy"), "top1",
     r"labels\.csv, line 3: label 'cat' of b\.npy is not a class index \(an integer >= 0\) \(metric top1\)"),
    (["a.npy,0", "a.npy,1"], ("a.npy",), "top1", r"line 3: 'a.npy' is labelled twice \(first on line 2\)"),
    (["a.npy,hello,world"], ("a.npy",), "cer", r"line 2: expected 2 fields"),
])
def test_labels_that_do_not_match_the_samples_name_the_file_and_line(tmp_path, rows, samples, metric, message):
    with pytest.raises(EvaluationError, match=message):
        labelled_samples(labelled_folder(tmp_path, rows, samples, metric), INFOS)


def test_a_post_processing_that_raises_names_itself_and_the_sample(tmp_path):
    (tmp_path / "post.py").write_text("def broken(outputs):\n    raise KeyError('scores')\n")
    evaluation = Evaluation(tmp_path, tmp_path / "l.csv", "top1", postprocess=f"{tmp_path / 'post.py'}:broken")
    task = TaskEvaluation.of(evaluation, ("first.npy", "second.npy"))
    with pytest.raises(EvaluationError, match=r"evaluation.postprocess .*post.py:broken raised on sample first.npy: "
                                              r"KeyError: 'scores'"):
        task.value([{"y": np.zeros(3)}], ["0"])


def test_an_unknown_output_is_named(tmp_path):
    task = TaskEvaluation.of(Evaluation(tmp_path, tmp_path / "l.csv", "top1", output="logits"))
    with pytest.raises(EvaluationError, match=r"evaluation.output 'logits' is not an output of the model "
                                              r"\(outputs: y\)"):
        task.value([{"y": np.zeros(3)}], ["0"])


# ------------------------------------------------------------------------------ the ratio to float and its interval


def test_a_share_metric_ratio_has_newcombes_interval_and_no_changed_sample_is_not_proof(tmp_path):
    task = TaskEvaluation.of(Evaluation(tmp_path, tmp_path / "l.csv", "top1"))
    outputs = [{"y": np.eye(3)[k % 3]} for k in range(8)]
    kpis = task.compare(outputs, outputs, [str(k % 3) for k in range(8)])
    assert kpis["task_metric"] == kpis["float_task_metric"] == 1.0 and kpis["task_metric_ratio"] == 1.0
    ratio = kpis["intervals"]["task_metric_ratio"]
    assert ratio["method"] == "newcombe" and ratio["samples"] == 8 and ratio["low"] < 0.98  # 8 samples decide nothing


def test_cer_ratio_is_bootstrapped_and_spans_its_range_on_few_samples(tmp_path):
    from harness import stats

    charset = tmp_path / "dict.txt"
    charset.write_text("a\nb\n")
    task = TaskEvaluation.of(Evaluation(tmp_path, tmp_path / "l.csv", "cer", postprocess="ctc_greedy",
                                        charset=charset))
    good, bad = one_hot_steps([1, 0, 2], 4), one_hot_steps([1, 0, 1], 4)
    kpis = task.compare([{"y": bad}] * 3, [{"y": good}] * 3, ["ab"] * 3)
    assert kpis["task_metric"] == 0.5 and kpis["float_task_metric"] == 0.0
    assert kpis["task_metric_ratio"] == 0.5 and kpis["task_metric_drop"] == 0.5
    assert kpis["intervals"]["task_metric_ratio"] | {} == {"low": 0.0, "high": 1.0, "samples": 3,
                                                          "method": "bootstrap", "confidence": 0.95}
    many = task.compare([{"y": bad}] * 10, [{"y": good}] * 10, ["ab"] * 10)["intervals"]["task_metric_ratio"]
    share = stats.resolvable_drop(10)  # every sample changed alike: the bootstrap's point, floored
    assert many["low"] == pytest.approx(0.5 * (1 - share)) and many["high"] == pytest.approx(0.5 + 0.5 * share)
    assert many["method"] == stats.FLOORED


def test_a_bootstrapped_ratio_with_no_changed_sample_is_not_proof(tmp_path):
    from harness import stats
    from harness.kpi import Limit

    charset = tmp_path / "dict.txt"
    charset.write_text("a\nb\n")
    task = TaskEvaluation.of(Evaluation(tmp_path, tmp_path / "l.csv", "cer", postprocess="ctc_greedy",
                                        charset=charset))
    same = [{"y": one_hot_steps([1, 0, 2], 4)}] * 12 + [{"y": one_hot_steps([1, 0, 1], 4)}] * 4
    kpis = task.compare(same, same, ["ab"] * 16)
    assert kpis["task_metric_ratio"] == 1.0 and kpis["task_metric_drop"] == 0.0
    ratio, drop = kpis["intervals"]["task_metric_ratio"], kpis["intervals"]["task_metric_drop"]
    assert ratio["method"] == stats.FLOORED and ratio["samples"] == 16
    share = stats.resolvable_drop(16)  # up to 19 % of the samples could change, each to all characters wrong
    assert ratio["low"] == pytest.approx(1 - share) and ratio["high"] > 1.0
    assert drop["high"] == pytest.approx(share * (1 - kpis["float_task_metric"])) and drop["low"] < 0
    (sentence,) = stats.unresolved(kpis, [Limit("task_metric_ratio", minimum=0.98)])
    needed = kpis["intervals"]["task_metric_ratio"]["needed"]
    assert stats.resolvable_drop(needed) <= 0.02 < stats.resolvable_drop(needed - 1) and f"about {needed}" in sentence


def test_a_ratio_on_too_few_samples_for_a_bootstrap_needs_at_least_that_many():
    from harness import stats
    from harness.kpi import Interval, Limit

    kpis = {"task_metric_ratio": 0.0, "intervals": {"task_metric_ratio": Interval(0.0, 1.0, 2, "bootstrap").as_dict()}}
    (sentence,) = stats.unresolved(kpis, [Limit("task_metric_ratio", minimum=0.98)])
    assert kpis["intervals"]["task_metric_ratio"]["needed"] == stats.MIN_BOOTSTRAP_SAMPLES
    assert sentence.startswith("inconclusive: 2 samples cannot resolve task_metric_ratio >= 0.98")


# ------------------------------------------------------------------------------ the spec section


def write_spec(tmp_path: Path, evaluation: str, thresholds: str = "") -> Path:
    from model_builders import conv_classifier

    conv_classifier(tmp_path / "clf.onnx")
    (tmp_path / "eval").mkdir(exist_ok=True)
    (tmp_path / "labels.csv").write_text("file,label\n")
    (tmp_path / "dict.txt").write_text("a\n")
    spec = tmp_path / "clf.yaml"
    spec.write_text(f"path: clf.onnx\nevaluation:\n{evaluation}{thresholds}")
    return spec


def test_the_section_sets_the_task_limits_and_leaves_output_limits_to_the_thresholds(tmp_path):
    spec = resolve_model(str(write_spec(tmp_path, "  {data: eval, labels: labels.csv, metric: top1}\n",
                                        "thresholds: {min_sqnr_db: 10}\n")), {}, None)
    t = spec.thresholds
    assert spec.evaluation.metric == "top1" and spec.evaluation.data == (tmp_path / "eval").resolve()
    assert t.min_task_metric_ratio == 0.98 and t.max_task_metric_drop is None  # MLPerf's default form
    assert t.min_cosine_similarity is None and t.min_sqnr_db == 10  # cosine recorded; SQNR as the spec set it
    drop = resolve_model(str(write_spec(tmp_path, "  {data: eval, labels: labels.csv, metric: top1, max_drop: 0.01}"
                                                  "\n")), {}, None).thresholds
    assert drop.max_task_metric_drop == 0.01 and drop.min_task_metric_ratio is None


def test_accuracy_limits_follow_the_thresholds(tmp_path):
    from harness.models import Thresholds
    from harness.steps.inference import accuracy_limits

    assert [str(lim) for lim in accuracy_limits(Thresholds())] == [  # no section: as before
        "task_metric_drop <= 0.02", "cosine_similarity >= 0.98", "sqnr_db >= 15"]
    spec = resolve_model(str(write_spec(tmp_path, "  {data: eval, labels: labels.csv, metric: top1}\n")), {}, None)
    assert [str(lim) for lim in accuracy_limits(spec.thresholds)] == ["task_metric_ratio >= 0.98"]


@pytest.mark.parametrize("section, message", [
    ("{data: eval, labels: labels.csv, metric: bleu}",
     r"evaluation.metric 'bleu' is not a built-in \(top1, top5, cer, word_accuracy, f1, detection_rate, false_accepts, hmean, map50\) nor module.py:function"),
    ("{data: eval, labels: labels.csv, metric: hmean, postprocess: ctc_greedy, charset: labels.csv}",
     r"evaluation.metric hmean scores boxes, but evaluation.postprocess ctc_greedy yields text"),
    ("{data: eval, labels: labels.csv, metric: cer}",
     r"evaluation.metric cer scores text, but evaluation.postprocess argmax yields classes"),
    ("{data: eval, labels: labels.csv, metric: cer, postprocess: ctc_greedy}", r"evaluation.charset is needed"),
    ("{data: eval, labels: labels.csv, metric: top1, postprocess: post.py:decode}",
     r"evaluation.postprocess '.*post.py:decode': no such file"),
    ("{data: nowhere, labels: labels.csv, metric: top1}", r"evaluation.data 'nowhere' is not a folder"),
    ("{data: eval, labels: labels.csv, metric: top1, min_ratio: 0.9}", r"evaluation.min_ratio: Extra inputs"),
])
def test_a_bad_section_is_a_config_error_naming_the_spec_and_key(tmp_path, section, message):
    spec = write_spec(tmp_path, f"  {section}\n")
    with pytest.raises(ConfigError, match=message) as caught:
        resolve_model(str(spec), {}, None)
    assert str(spec) in str(caught.value)


# ------------------------------------------------------------------------------ a user's own model, end to end

SUITES = Path(__file__).resolve().parent.parent / "suites"
SPINE = ("-k", "(feasibility or conversion or float_baseline or ptq) and not llm")


@pytest.fixture(scope="module")
def zoo_models(cache) -> dict[str, Path]:
    """The zoo's digits models (trained once per cache), built before pytester snapshots sys.modules."""
    from harness.model_sources import source_model

    return {name: source_model(resolve_model(name, {}, None), cache) for name in ("digits_cnn", "digits_imbalanced")}


def user_project(root: Path, model: Path, evaluation: str, files: dict[str, str]) -> Path:
    """Write a user's project outside the repository: the model (a zoo model's file), calibration samples, a
    labelled folder of 300 held-out digits, the plug-ins in `files` and a spec with `evaluation`; return the spec."""
    import shutil

    from harness.zoo import digits_cnn

    root.mkdir(parents=True)
    shutil.copy(model, root / "model.onnx")
    _, calib, held_out = digits_cnn.load_splits(seed=0)
    (root / "calib").mkdir()
    np.save(root / "calib" / "digits.npy", calib.inputs[:, None])
    (root / "eval").mkdir()
    rows = ["file,label"]
    for k in range(300):
        np.save(root / "eval" / f"digit{k:03d}.npy", held_out.inputs[k][None])
        rows.append(f"digit{k:03d}.npy,{held_out.labels[k]}")
    (root / "eval" / "labels.csv").write_text("\n".join(rows) + "\n")
    for name, text in files.items():
        (root / name).write_text(text)
    spec = root / "digits.yaml"
    spec.write_text(f"name: my_digits\npath: model.onnx\ncalib_data: calib\nevaluation:\n{evaluation}")
    return spec


@pytest.mark.parametrize("zoo_name, evaluation, files, outcome", [
    # the user's post-processing (the best class as an int) and the built-in top-1: 8-bit PTQ keeps it decisively
    ("digits_cnn", "  {data: eval, labels: eval/labels.csv, postprocess: decode.py:best, metric: top1}\n",
     {"decode.py": "import numpy as np\n\ndef best(outputs):\n    return int(np.argmax(next(iter(outputs.values()))))\n"},
     "passed"),
    # channels 8-bit per-tensor ranges crush (harness.zoo.digits_imbalanced), scored by the user's own metric: the
    # ratio to float falls far below 0.98, decisively
    ("digits_imbalanced", "  {data: eval, labels: eval/labels.csv, metric: score.py:accuracy, "
                          "min_ratio_to_float: 0.98}\n",
     {"score.py": "def accuracy(predictions, labels):\n"
                  "    return [float(p[0] == int(y)) for p, y in zip(predictions, labels)]\n"},
     "failed"),
])
def test_a_users_model_onboards_and_ptq_is_judged_on_its_task_metric(zoo_models, pytester, session_cache_dir,
                                                                      tmp_path, zoo_name, evaluation, files, outcome,
                                                                      monkeypatch):
    import json

    # all 300 labelled samples, however busy this host is (the default 8 s budget per pass, timed on the simulator,
    # fits 146 of them at a load average of 13): this test is about the task metric's verdict, not the set's size
    monkeypatch.setenv("HARNESS_EVAL_BUDGET_S", "600")
    spec = user_project(tmp_path / "elsewhere" / zoo_name, zoo_models[zoo_name], evaluation, files)
    kpi = pytester.path / "kpi.json"
    result = pytester.runpytest_subprocess(str(SUITES), "--model", str(spec), "--cache-dir", str(session_cache_dir),
                                           "--kpi-json", str(kpi), "--alluredir", str(pytester.path / "allure"),
                                           "-p", "no:cacheprovider", "-rA", *SPINE)
    steps = {r["step"]: r for r in json.loads(kpi.read_text())["records"]}
    assert steps["conversion"]["outcome"] == "passed" and steps["float_baseline"]["outcome"] == "passed"
    ptq = steps["ptq"]
    k = ptq["kpis"]
    assert ptq["outcome"] == outcome, (ptq["message"], result.stdout.str()[-2000:])
    assert k["samples"] == 300 and "300 labelled samples from" in k["dataset"]
    assert k["float_task_metric"] > 0.95 and k["host_qdq_task_metric"] == pytest.approx(k["task_metric"], abs=0.05)
    ratio = k["intervals"]["task_metric_ratio"]
    if outcome == "passed":
        assert k["task_metric_name"] == "top1" and ratio["method"] == "newcombe" and ratio["low"] >= 0.98
    else:
        assert k["task_metric_name"] == "accuracy" and ratio["method"] == "bootstrap" and ratio["high"] < 0.98
        assert "FAIL: task_metric_ratio" in ptq["message"] and "rule task_metric_ratio >= 0.98" in ptq["message"]
    assert "cosine_similarity" not in {rule.split(" ")[0] for rule in ptq["message"].split("rule ")[1:]}
    # the sign-off page shows the task metric per device x model x precision beside float's, ratio, interval, count
    build_signoff([kpi], tmp_path / "signoff")
    html = (tmp_path / "signoff" / "index.html").read_text()
    task = html[html.index('<section id="task"'):]
    task = task[:task.index("</section>")]
    row = re.search(r"<tr><td class=\"mono\">([^<]+)</td><td class=\"mono\">my_digits</td><td class=\"mono\">"
                    r"MinMax-a8-w8-pt</td><td>(\w+)</td><td>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td>"
                    r"<td>\[([^,]+), ([^\]]+)\] (\w+)</td><td>300</td><td>(\w+)</td></tr>", task)
    assert row, task
    assert row[2] == k["task_metric_name"] and float(row[3]) == pytest.approx(k["task_metric"], rel=1e-3)
    assert float(row[5]) == pytest.approx(k["task_metric_ratio"], rel=1e-3) and row[9] == outcome
    assert float(row[6]) == pytest.approx(ratio["low"], rel=1e-3, abs=1e-4) and row[8] == ratio["method"]
    assert "float (device CPU)" in task and '<a href="#task">Task accuracy</a>' in html
    # and Allure, as a step of the PTQ test: the metric beside float's, the ratio with its interval and count
    titles = [step["name"] for f in (pytester.path / "allure").glob("*-result.json")
              for top in json.loads(f.read_text()).get("steps", []) for step in top.get("steps", [])]
    line = next(t for t in titles if t.startswith(f"task metric: {k['task_metric_name']} "))
    assert f"ratio to float {k['task_metric_ratio']:.4g}" in line and "n=300" in line, line
