"""The import graph of harness/: no import cycles, no import from a lower layer into a higher one (the layers of
docs/architecture.md, declared in LAYERS), and imports inside function bodies only where LAZY says why.

The graph is read from the sources with `ast`: module-level imports (TYPE_CHECKING blocks included) and imports
inside function bodies, of harness modules only. `from harness.steps import ptq` is an import of
harness.steps.ptq; importing a module does not count as importing its package's __init__.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parent.parent / "harness"


def _modules(names: str, package: str = "harness") -> tuple[str, ...]:
    return tuple(f"{package}.{name}" if name != "." else package for name in names.split())


# Lowest first: a module may import its own layer's modules (without a cycle) and the layers below it, never
# one above. "pkg.*" is a package and every module in it; a module named on its own wins over its package.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("device-side programs (pushed to the device: they import only each other)",
     _modules("runner.device_runner runner.llm_runner runner.genie_runner")),
    ("foundation: errors, files, records, KPI rules and statistics",
     _modules(". errors files kpi stats repeats reasons metrics host_sessions shutdown transports.retry "
              "runner clock json_values versions reporting reporting.records reporting.names options user_code")),
    ("what is onboarded where: devices and SoCs, models, data, the cache, the conversion transforms, the emulated "
     "devices, the built-in models",
     _modules("devices models target data cache cache_check quantization quantization.* convert convert.* evaluation "
             "evaluation.* qnn_ops qnn_errors placement profiling estimate emulator emulator.* zoo zoo.* llm llm.gpt "
             "llm.convention llm.text llm.export llm.checkpoint llm.gpt2_names llm.gguf_reader llm.hf_reader llm.llama "
             "llm.importer llm.memory model_sources")),
    ("transports", _modules("transports transports.* soc_detect telemetry farm.cooldown")),
    ("runner", _modules("runner.base runner.client runner.server_client runner.qnn_net_run farm farm.* sizing")),
    ("steps", _modules("steps steps.* soak reporting.charts baseline latency_ab llm.calibration llm.blockwise "
                       "llm.device llm.steps llm.shipping llm.genie_steps llm.genie_config llm.reference llm.ceiling")),
    ("pipelines", _modules("pipeline_base pipeline llm.pipeline")),
    ("session and reports", _modules("session reporting.allure reporting.summary reporting.report_cli signoff "
                                     "signoff.* profile_view corpus corpus_data history history.*")),
    ("pytest plugin, suites and commands", _modules("plugin plugin.* suites suites.* __main__")),
]

# Imports that stay inside a function body, and why: each defers a heavy third-party library (onnx, onnxruntime,
# paramiko, adbutils, tokenizers) that the importing module does not load otherwise, or lets the emulated device
# run without the SoC catalog. Any other import belongs at module level. The pytest plugin's hooks and fixtures keep theirs
# (STYLE.md 8: pytest loads the plugin for every run, options and --help included).
LAZY_IMPORTERS = {"harness.plugin": "the pytest plugin: heavy imports inside hooks and fixtures (STYLE.md 8)"}
LAZY: dict[tuple[str, str], str] = {
    ("harness.transports", "harness.transports.ssh"): "paramiko, for SSH devices only",
    ("harness.transports", "harness.transports.adb"): "adbutils, for adb devices only",
    ("harness.model_sources", "harness.zoo.tiny_gpt"): "tokenizers and scipy, for the built-in language model only",
    ("harness.baseline", "harness.model_sources"): "onnx (a zoo model's build), for the model hash only",
    ("harness.models", "harness.convert"): "onnx: model specs and options parse without it",
    ("harness.models", "harness.convert.shapes"): "onnx: model specs and options parse without it",
    ("harness.quantization.overrides", "harness.convert.opset"): "onnx: encodings files validate without it",
    ("harness.steps.regression", "harness.latency_ab"): "onnx, for an A/B on the device only",
    ("harness.steps.regression", "harness.steps.profile"): "onnx, for an A/B on the device only",
    ("harness.steps.ptq", "harness.quantization.calibration"): "onnxruntime.quantization, when a model is quantized",
    ("harness.steps.sweep", "harness.quantization.calibration"): "onnxruntime.quantization, when a model is quantized",
    ("harness.steps.error_isolation", "harness.quantization.calibration"): "onnxruntime.quantization, for float "
                                                                           "activations",
    ("harness.steps.table", "harness.steps.profile"): "numpy, onnx and matplotlib: the plugin reads the step table "
                                                      "at start-up, a step's module loads when the step runs",
    ("harness.steps.table", "harness.latency_ab"): "onnx, for an A/B on the device only",
    ("harness.steps.table", "harness.steps.regression"): "onnx, when the regression step runs (and it reads the "
                                                         "table's rules: a cycle at module level)",
    ("harness.emulator.adbd", "harness.devices"): "the emulated device reads the SoC catalog when it can (and "
                                                  "runs without it)",
    ("harness.emulator.thermal", "harness.devices"): "the emulated device reads the SoC catalog when it can (and "
                                                     "runs without it)",
}


@dataclass(frozen=True)
class Import:
    """One import of a harness module: where it is and whether it runs at module level."""

    importer: str
    imported: str
    path: Path
    line: int
    in_function: bool

    def __str__(self) -> str:
        return f"{self.path.relative_to(HARNESS.parent)}:{self.line} imports {self.imported}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(HARNESS.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """Return the harness module `name` is (or is in), e.g. harness.steps.ptq.QuantRecipe -> harness.steps.ptq."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def _imports_of(module: str, path: Path, source: str | None = None) -> list[Import]:
    """Return the harness imports in module's source (path's text unless given)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def add(node: ast.stmt, names: list[str], in_function: bool) -> None:
        for target in dict.fromkeys(_resolve(name) for name in names):  # one per module a statement imports
            if target is not None and target != module:
                found.append(Import(module, target, path, node.lineno, in_function))

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                add(child, [a.name for a in child.names if a.name.split(".")[0] == "harness"], in_function)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([child.module] if child.module else []))
                if base.split(".")[0] == "harness":
                    # `from harness.steps import ptq` imports the module harness.steps.ptq; `from harness.kpi
                    # import Limit` imports harness.kpi
                    add(child, [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names],
                        in_function)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text(encoding="utf-8") if source is None else source), False)
    return found


IMPORTS = [imp for module, path in MODULES.items() for imp in _imports_of(module, path)]


def _layer_of(module: str) -> int:
    """Return the index in LAYERS of module's layer (a module named on its own wins over its package's entry)."""
    exact = [i for i, (_, names) in enumerate(LAYERS) if module in names]
    if exact:
        return exact[0]
    package = [i for i, (_, names) in enumerate(LAYERS) for n in names
               if n.endswith(".*") and module.startswith(n[:-1])]
    return package[0] if package else -1


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """Return one import cycle of graph as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_every_module_is_in_exactly_one_layer():
    names = [n for _, layer in LAYERS for n in layer]
    assert sorted({n for n in names if names.count(n) > 1}) == [], "named in two layers"
    unplaced = [m for m in MODULES if _layer_of(m) < 0]
    assert unplaced == [], f"modules in no layer of LAYERS (add them where they belong): {unplaced}"
    unknown = [n for n in names if not n.endswith(".*") and n not in MODULES]
    assert unknown == [], f"LAYERS names modules that do not exist: {unknown}"


def test_no_import_cycles_at_module_level():
    graph: dict[str, set[str]] = {}
    for imp in IMPORTS:
        if not imp.in_function:
            graph.setdefault(imp.importer, set()).add(imp.imported)
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{imp} (layer '{LAYERS[_layer_of(imp.imported)][0]}') from layer '{LAYERS[_layer_of(imp.importer)][0]}'"
              for imp in IMPORTS if _layer_of(imp.imported) > _layer_of(imp.importer)]
    assert upward == [], "imports from a higher layer:\n" + "\n".join(upward)


def _lazy_allowed(imp: Import) -> bool:
    return ((imp.importer, imp.imported) in LAZY
            or any(imp.importer == p or imp.importer.startswith(p + ".") for p in LAZY_IMPORTERS))


def test_imports_inside_functions_are_only_the_listed_ones():
    unlisted = [str(imp) for imp in IMPORTS if imp.in_function and not _lazy_allowed(imp)]
    assert unlisted == [], ("imports inside a function body that belong at module level (or in LAZY, saying "
                            "which heavy dependency they defer):\n" + "\n".join(unlisted))
    kept = {(imp.importer, imp.imported) for imp in IMPORTS if imp.in_function}
    assert sorted(set(LAZY) - kept) == [], "LAZY lists imports that are no longer inside a function: remove them"


@pytest.mark.parametrize("source, expected", [
    ("from harness.steps import ptq\n", ["harness.steps.ptq"]),
    ("from harness.kpi import Limit\n", ["harness.kpi"]),
    ("import harness.steps.ptq\n", ["harness.steps.ptq"]),
    ("def f():\n    from . import device_time\n", ["harness.emulator.device_time (in function)"]),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness.pipeline import Onboarding\n",
     ["harness.pipeline"]),
])
def test_the_graph_reader_sees_each_kind_of_import(source, expected):
    found = _imports_of("harness.emulator.thermal", HARNESS / "emulator" / "thermal.py", source)
    assert [f"{i.imported}{' (in function)' if i.in_function else ''}" for i in found] == expected
