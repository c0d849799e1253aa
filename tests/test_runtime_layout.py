"""The rooms of ``hpcrl/runtime`` and the directions data may flow between them (docs/architecture.md).

runners -> roles -> transport | record -> the top files (plan, topology, placement, signals, backoff, messages):
a module imports only from its own room and the rooms below it, transport and record not from each other; every
import counts, those inside functions and under TYPE_CHECKING too. Roles get their config sections from the runners
(runners/job.py make_role): nothing below the runners reads the Plan's ``sections``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

RUNTIME = Path(__file__).resolve().parents[1] / "hpcrl" / "runtime"
LEVEL = {"top": 0, "transport": 1, "record": 1, "roles": 2, "runners": 3}
"""Each room's level: a module imports runtime modules of its own room or of lower levels."""


def room_of(module: str) -> str | None:
    """The room of a dotted module name under hpcrl.runtime (None outside it)."""
    parts = module.split(".")
    if parts[:2] != ["hpcrl", "runtime"]:
        return None
    if len(parts) == 2:
        return "top"  # hpcrl.runtime itself
    return parts[2] if parts[2] in LEVEL else "top"


def runtime_modules() -> list[Path]:
    return sorted(RUNTIME.rglob("*.py"))


def module_name(path: Path) -> str:
    rel = path.relative_to(RUNTIME.parents[1]).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def imported(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, module) of every import in ``tree``, relative ones resolved against ``package``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base]).rstrip(".")
            # "from hpcrl.runtime import roles" imports the room roles
            out += [(node.lineno, f"{base}.{a.name}" if room_of(f"{base}.{a.name}") != room_of(base) else base)
                    for a in node.names]
    return out


def wrong_way(path: Path) -> list[str]:
    """Imports of ``path`` against the allowed directions, one line each."""
    name = module_name(path)
    here = room_of(name)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    bad = []
    for line, target in imported(ast.parse(path.read_text(), str(path)), package):
        there = room_of(target)
        if there is None or there == here:
            continue
        if LEVEL[there] >= LEVEL[here]:
            bad.append(f"{path.relative_to(RUNTIME.parents[1])}:{line}: {here} imports {target} ({there})")
    return bad


def test_every_runtime_import_goes_the_allowed_way():
    bad = [line for path in runtime_modules() for line in wrong_way(path)]
    assert not bad, "imports against runners -> roles -> transport | record -> top:\n" + "\n".join(bad)


def test_only_the_runners_read_the_plans_sections():
    bad = []
    for path in runtime_modules():
        if room_of(module_name(path)) == "runners" or path.name == "plan.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "sections":
                bad.append(f"{path.relative_to(RUNTIME.parents[1])}:{node.lineno}")
    assert not bad, "a role (or what it uses) reads plan.sections instead of its own settings: " + ", ".join(bad)


@pytest.mark.parametrize("source, target, allowed", [
    ("hpcrl/runtime/roles/x.py", "hpcrl.runtime.transport.windows", True),
    ("hpcrl/runtime/transport/x.py", "hpcrl.runtime.roles.elastic", False),
    ("hpcrl/runtime/transport/x.py", "hpcrl.runtime.record.allocation", False),
    ("hpcrl/runtime/record/x.py", "hpcrl.runtime.messages", True),
    ("hpcrl/runtime/plan.py", "hpcrl.runtime.runners", False),
    ("hpcrl/runtime/runners/x.py", "hpcrl.runtime.roles.actor", True),
])
def test_the_check_tells_a_wrong_import_from_a_right_one(tmp_path, monkeypatch, source, target, allowed):
    """The check itself: a module written into a copy of the rooms is judged by its room."""
    root = tmp_path / "hpcrl" / "runtime"
    path = tmp_path / source
    path.parent.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(f"def f():\n    import {target}\n")
    monkeypatch.setattr(f"{__name__}.RUNTIME", root)
    assert (wrong_way(path) == []) is allowed
