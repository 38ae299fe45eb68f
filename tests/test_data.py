"""Calibration data: .npy/.npz directories with errors naming the file, and the random fallback."""

import numpy as np
import pytest

from harness.data import InputInfo, feeds_digest, load_calibration_dir, random_dataset
from harness.errors import ConfigError

ONE = [InputInfo("input", (1, 3, 4, 4), np.float32)]
TWO = [InputInfo("a", (1, 2), np.float32), InputInfo("b", (1, 3), np.float32)]


def test_npy_single_samples_and_stacks(tmp_path):
    np.save(tmp_path / "0.npy", np.zeros((1, 3, 4, 4), np.float32))
    np.save(tmp_path / "1.npy", np.ones((5, 1, 3, 4, 4), np.float64))
    feeds = load_calibration_dir(tmp_path, ONE)
    assert len(feeds) == 6
    assert all(f["input"].shape == (1, 3, 4, 4) and f["input"].dtype == np.float32 for f in feeds)


def test_npz_keyed_by_input_name(tmp_path):
    np.savez(tmp_path / "s.npz", a=np.zeros((1, 2)), b=np.ones((1, 3)))
    feeds = load_calibration_dir(tmp_path, TWO)
    assert len(feeds) == 1 and set(feeds[0]) == {"a", "b"}


@pytest.mark.parametrize("make, infos, message", [
    (lambda d: np.save(d / "bad.npy", np.zeros((2, 2))), ONE, r"bad\.npy: input 'input' has shape \[2, 2\], expected \[1, 3, 4, 4\]"),
    (lambda d: np.save(d / "x.npy", np.zeros((1, 2))), TWO, r"x\.npy: the model has 2 inputs"),
    (lambda d: np.savez(d / "y.npz", a=np.zeros((1, 2))), TWO, r"y\.npz: no array for input\(s\) b"),
    (lambda d: (d / "z.npy").write_bytes(b"garbage"), ONE, r"z\.npy: cannot read as numpy data"),
    (lambda d: None, ONE, r"no \.npy or \.npz files"),
], ids=["wrong-shape", "npy-for-two-inputs", "missing-key", "garbage", "empty"])
def test_bad_calibration_files_are_named(tmp_path, make, infos, message):
    make(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_calibration_dir(tmp_path, infos)


def test_random_data_is_deterministic_and_flagged():
    a, b = random_dataset(ONE, "model-x"), random_dataset(ONE, "model-x")
    assert feeds_digest(a.calibration) == feeds_digest(b.calibration)
    assert feeds_digest(a.calibration) != feeds_digest(random_dataset(ONE, "model-y").calibration)
    assert not a.labelled and "random data" in a.warnings[0]


def test_suites_use_calibration_directory(pytester, session_cache_dir):
    from model_builders import conv_classifier
    from test_plugin import SUITES

    model = conv_classifier(pytester.path / "clf.onnx")
    calib = pytester.mkdir("calib")
    rng = np.random.default_rng(1)
    np.save(calib / "batch.npy", rng.random((8, 1, 3, 8, 8), dtype=np.float32))
    result = pytester.runpytest_subprocess(str(SUITES), "--model", str(model), "--calib-data", str(calib),
                                           "--cache-dir", str(session_cache_dir), "-p", "no:cacheprovider", "-k", "ptq")
    # the directory's 8 samples are used: too few to decide a 2 % drop, which the step says
    assert result.parseoutcomes().get("inconclusive") == 1, result.stdout.str()
    result.stdout.fnmatch_lines(["*8 samples cannot resolve a drop of 0.02*about 189 are needed*"])
    assert "random data" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*no labels: task KPIs are agreement with the float model*"])
