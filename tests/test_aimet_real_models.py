"""AIMET on real pretrained exports (the corpus), as a user runs it: the harness converts the model, aimet-onnx 2.42
computes encodings on the converted graph with the model's calibration data and exports them in each layout, and
the suites take the file unchanged with --quantization-overrides: PTQ quantizes with it and runs on the HTP.
Marked `aimet` (pytest tests/ -m aimet, after bash scripts/install-aimet.sh); needs the fetched corpus."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.models import resolve_model
from real_models_helpers import real_model_spec

DATA = Path(__file__).resolve().parent / "data" / "aimet"
SUITES = Path(__file__).resolve().parent.parent / "suites"
VERSIONS = ("1.0.0", "0.6.1", "2.0.0")
# AIMET runs in its own process, as a user runs it beside the harness (torch and a second onnxruntime session
# graph in the test process crashed the interpreter at garbage collection, after the run had passed)
EXPORT = """
import importlib.util, json, sys
import numpy as np
from pathlib import Path
spec = importlib.util.spec_from_file_location("make", sys.argv[1]); make = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make)
with np.load(sys.argv[3]) as data:
    names = sorted({k.split("/", 1)[1] for k in data.files})
    feeds = [{n: data[f"{i}/{n}"] for n in names} for i in range(len(data.files) // len(names))]
model, files = make.aimet_export(Path(sys.argv[2]), Path(sys.argv[4]), sys.argv[5], "int8", "int8",
                                 tuple(sys.argv[6].split(",")), feeds)
print(json.dumps({"model": str(model), "files": {v: str(p) for v, p in files.items()}}))
"""


CONVERT = """
import sys
from pathlib import Path
import numpy as np, onnx
from harness.cache import ArtifactCache
from harness.data import input_infos, load_calibration_dir
from harness.models import resolve_model
from harness.steps import conversion
spec = resolve_model(sys.argv[1], {}, None)
cache = ArtifactCache(Path(sys.argv[2]))
fixed = conversion.fixed_shape_model(spec.path, spec, cache)
converted = conversion.convert(spec.path, fixed, spec, cache).artifacts["model"]
feeds = load_calibration_dir(spec.calib_data, input_infos(onnx.load(str(converted))))[:8]
np.savez(sys.argv[3], **{f"{i}/{k}": v for i, f in enumerate(feeds) for k, v in f.items()})
print(converted)
"""


def converted_model(spec: Path, cache_dir: Path, feeds: Path) -> Path:
    """Return the harness's converted model of a corpus spec (its calibration feeds written to `feeds`)."""
    proc = subprocess.run([sys.executable, "-c", CONVERT, str(spec), str(cache_dir), str(feeds)], capture_output=True,
                          text=True, timeout=900, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def aimet_export(model: Path, out_dir: Path, prefix: str) -> tuple[Path, dict[str, Path]]:
    """Run tests/data/aimet/make.py's aimet_export in a subprocess on the feeds in out_dir/feeds.npz; return
    (exported model, {version: file})."""
    proc = subprocess.run([sys.executable, "-c", EXPORT, str(DATA / "make.py"), str(model), str(out_dir / "feeds.npz"),
                           str(out_dir), prefix, ",".join(VERSIONS)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return Path(result["model"]), {v: Path(p) for v, p in result["files"].items()}


# silero_vad's calibration frames hold speech and silence (harness.corpus_data): on frames near its speech
# threshold, AIMET's 8-bit encodings flip the decision of 2 of 16 (cosine still > 0.98), which PTQ's drop limit
# (0.02 of the float decisions) then fails on its evidence, naming the interval: a verdict, not an error
MAY_MISS_KPI = {"silero_vad": "FAIL: task_metric_drop"}


@pytest.mark.aimet
@pytest.mark.parametrize("name", ["mtcnn_pnet", "silero_vad"])
def test_aimet_encodings_of_a_real_export_run_through_the_suites_unchanged(name, pytester, session_cache_dir, tmp_path):
    if importlib.util.find_spec("aimet_onnx") is None:
        pytest.skip("AIMET is not installed: bash scripts/install-aimet.sh")
    spec = resolve_model(str(real_model_spec(name)), {}, None)
    out = tmp_path / "aimet"
    out.mkdir()
    converted = converted_model(real_model_spec(name), session_cache_dir, out / "feeds.npz")
    model, files = aimet_export(converted, out, name)
    user_spec = tmp_path / f"{name}_aimet.yaml"
    user_spec.write_text(yaml.safe_dump({"name": f"{name}_aimet", "path": str(model), "calib_data": str(spec.calib_data)}))
    for version in VERSIONS:
        kpi = tmp_path / f"kpi_{version}.json"
        result = pytester.runpytest_subprocess(
            str(SUITES), "--device", "sm8650", "--model", str(user_spec), "--quantization-overrides", str(files[version]),
            "-k", "ptq and not llm", "--cache-dir", str(session_cache_dir), "--kpi-json", str(kpi), "-p", "no:cacheprovider")
        record = next(r for r in json.loads(kpi.read_text())["records"] if r["step"] == "ptq")
        # a corpus model's 16 samples may not resolve the 0.02 drop either way: inconclusive (exit 7), not failed
        verdicts = {"passed": 0, "inconclusive": 7, **({"failed": 1} if name in MAY_MISS_KPI else {})}
        assert record["outcome"] in verdicts and result.ret == verdicts[record["outcome"]], (version, record["message"])
        if record["outcome"] == "failed":
            assert MAY_MISS_KPI[name] in record["message"] and "(95% wilson, n=" in record["message"], version
        ptq = record["kpis"]
        assert ptq["runtime"] == "htp" and "+overrides" in ptq["recipe"] and ptq["cosine_similarity"] > 0.98, version
