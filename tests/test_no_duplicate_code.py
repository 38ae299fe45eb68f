"""No function body stands in two harness modules: one copy of each serialiser, writer and helper (issue 20).

Every function and method under harness/ is normalised (its body without the docstring, dumped by ast without
line numbers) and a body of more than MIN_STATEMENTS statements may appear in one module only. A copy is folded
into one function in the lowest module its users share, not allowed here; ALLOWED is for bodies that are alike by
accident and serve different purposes, each with its reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

HARNESS = Path(__file__).resolve().parent.parent / "harness"
MIN_STATEMENTS = 5  # a body of up to this many statements (a delegation, a property) may stand twice
ALLOWED: dict[frozenset[str], str] = {}  # {frozenset({"module:function", "module:function"}): reason}


def _body(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    """Return fn's body without its docstring."""
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return body


def _statements(body: list[ast.stmt]) -> int:
    """Return how many statements body holds, nested ones included."""
    return sum(isinstance(node, ast.stmt) for stmt in body for node in ast.walk(stmt))


def _functions(tree: ast.AST, prefix: str = ""):  # type: ignore[no-untyped-def]
    """Yield (qualified name, function node) of every function and method in tree, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def repeated_bodies(root: Path) -> list[tuple[str, str]]:
    """Return the pairs of 'module:function' under root whose bodies (of more than MIN_STATEMENTS statements)
    are the same in two different modules."""
    places: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root.parent).as_posix()
        for name, fn in _functions(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            body = _body(fn)
            if _statements(body) > MIN_STATEMENTS:
                places["\n".join(ast.dump(stmt) for stmt in body)].append((module, name))
    pairs = []
    for found in places.values():
        for i, (module_a, name_a) in enumerate(found):
            for module_b, name_b in found[i + 1:]:
                if module_a != module_b:
                    pairs.append((f"{module_a}:{name_a}", f"{module_b}:{name_b}"))
    return pairs


def test_no_function_body_is_repeated_across_harness_modules() -> None:
    repeated = [pair for pair in repeated_bodies(HARNESS) if frozenset(pair) not in ALLOWED]
    assert not repeated, "the same function body stands in two modules (fold it into one function in a module " \
                         "both can import):\n" + "\n".join(f"  {a} == {b}" for a, b in repeated)


def test_every_allowed_pair_still_exists_and_says_why() -> None:
    current = {frozenset(pair) for pair in repeated_bodies(HARNESS)}
    for pair, reason in ALLOWED.items():
        assert reason.strip(), f"{sorted(pair)}: give the reason the two bodies stay apart"
        assert pair in current, f"{sorted(pair)} no longer repeat each other: remove them from ALLOWED"


_SERIALISER = '''
def {name}(value):
    """A JSON default."""
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)
'''


def test_the_check_names_a_body_copied_into_another_module(tmp_path: Path) -> None:
    root = tmp_path / "harness"
    (root / "sub").mkdir(parents=True)
    (root / "session.py").write_text(_SERIALISER.format(name="_json_default"))
    (root / "sub" / "baseline.py").write_text("class Snapshot:\n" + _SERIALISER.format(name="to_json")
                                              .replace("\n", "\n    ").replace('"""A JSON default."""', '"""Other."""'))
    (root / "short.py").write_text("def f(value):\n    return str(value)\n")
    (root / "short2.py").write_text("def g(value):\n    return str(value)\n")
    assert repeated_bodies(root) == [("harness/session.py:_json_default", "harness/sub/baseline.py:Snapshot.to_json")]
