"""The package's architecture, checked: layers that import only downwards, no import cycle, no private name imported
from another module, no test file importing another; the core takes paths, and no loader starts a build or a fetch."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest
from helpers import ROOT

PACKAGE = ROOT / "uturn_train"
# Bottom to top: a module imports only from its own layer or lower ones. The testbed and the zoo turn model names into
# folders: users of the core, which takes paths; the commands (and `cli.py`, the package's `__init__`) are on top.
LAYERS = [
    {"io", "stats", "tracking", "tasks", "_moved"},
    {"models", "chat", "generation", "shared_prefix", "distributed", "server"},
    {"probe"},
    {"collab"},
    {"training"},
    {"experiments"},
    {"testbed", "zoo"},
    {"commands", "cli", "__init__"},
]
# Inside the probe, the rules read text only: nothing of the probe's generation, labellers or jobs.
RULES = "uturn_train.probe.rules"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names) of every import of `path` that reaches a module of the package, at module level or inside
    functions; `from package import submodule` reaches the submodule."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "uturn_train"]
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(path, node)
            if module.split(".")[0] != "uturn_train":
                continue
            for a in node.names:
                sub = f"{module}.{a.name}"
                found.append((sub, []) if sub in MODULES else (module, [a.name]))
    return found


def edges() -> dict[str, set[str]]:
    graph = defaultdict(set)
    for name, path in MODULES.items():
        for target, _ in imports(path):
            if target in MODULES and target != name:
                graph[name].add(target)
    return graph


def test_every_import_of_the_package_resolves():
    # An import inside a function only fails when the function runs: a stale path after a move shows here.
    broken = [(name, target) for name, path in MODULES.items() for target, _ in imports(path) if target not in MODULES]
    assert not broken, f"imports of modules that do not exist: {broken}"


def layer(module: str) -> int:
    top = module.split(".")[1] if module.count(".") else "__init__"
    return next(i for i, names in enumerate(LAYERS) if top in names)


def test_every_module_has_a_layer_and_the_scan_sees_imports():
    for name in MODULES:
        layer(name)  # StopIteration: a new top-level module or folder needs its place in LAYERS
    graph = edges()
    assert "uturn_train.zoo" in graph["uturn_train.commands.probe"], "the scan must see the commands resolve names"
    assert "uturn_train.probe.rules.text" in graph["uturn_train.probe.rules.grounding"]


@pytest.mark.parametrize("name", sorted(MODULES), ids=lambda n: n.removeprefix("uturn_train."))
def test_module_imports_only_its_layer_or_lower(name):
    up = sorted(t for t in edges()[name] if layer(t) > layer(name))
    assert not up, f"{name} (layer {layer(name)}) imports from higher layers: {up}"
    if name.startswith(RULES):
        outside = sorted(t for t in edges()[name] if t.startswith("uturn_train.probe") and not t.startswith(RULES))
        assert not outside, f"{name}: the rules import the rest of the probe: {outside}"


def test_no_import_cycle():
    graph, state, stack = edges(), {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(MODULES):
        if node not in state:
            visit(node)


@pytest.mark.parametrize("name", sorted(MODULES), ids=lambda n: n.removeprefix("uturn_train."))
def test_no_private_name_of_another_module(name):
    path = MODULES[name]
    private = [f"{module}.{n}" for module, names in imports(path) for n in names
               if n.startswith("_") and not n.startswith("__") and module != name]
    # `module._name` on a module of the package imported under a name of its own
    tree = ast.parse(path.read_text())
    aliases = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and _resolve(path, node).startswith("uturn_train") for a in node.names
               if f"{_resolve(path, node)}.{a.name}" in MODULES}
    private += [f"{node.value.id}.{node.attr}" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")]
    assert not private, f"{name} uses private names of other modules: {private}"


def test_no_test_file_imports_another():
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad = [n for n in names if n.split(".")[-1].startswith("test_")]
            assert not bad, f"{path.relative_to(ROOT)} imports test file(s) {bad}: shared pieces go in tests/helpers"


def test_loaders_never_build_or_fetch(tmp_path, monkeypatch):
    from uturn_train.models import load_tokenizer
    from uturn_train.tasks import load_task
    from uturn_train.training.data import CollabDataArguments, load_conversations
    from uturn_train.training.mining import MiningArguments, mining_examples

    monkeypatch.setenv("UTURN_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match="pass its heldout.jsonl as data"):
        load_task("testbed")
    with pytest.raises(ValueError, match="pass it as mine_data"):
        mining_examples(MiningArguments(mine_source="testbed"))
    with pytest.raises(ValueError, match="pass it as collab_data"):
        load_conversations(CollabDataArguments(collab_source="testbed"))
    with pytest.raises(ValueError, match="smollm2-135m-instruct.*only resolved by the uturn commands"):
        load_tokenizer("smollm2-135m-instruct")  # offline: a hub lookup that fails, never a fetch
    assert not (tmp_path / "home").exists()


def test_moved_modules_keep_their_old_names_for_a_release():
    import importlib
    import warnings

    from uturn_train._moved import MOVED

    for old, new in MOVED.items():
        assert new in MODULES, f"{old} points at {new}, which does not exist"
        assert old not in MODULES, f"{old} exists again beside its alias"
    with pytest.warns(FutureWarning, match="uturn_train.probe.grounding moved to uturn_train.probe.rules.grounding"):
        old = importlib.import_module("uturn_train.probe.grounding")
    assert old is importlib.import_module("uturn_train.probe.rules.grounding")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        importlib.import_module("uturn_train.probe.rules.grounding")  # the new name warns nothing
