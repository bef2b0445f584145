"""The core takes paths: no core module imports the testbed, and no loader starts a build."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "uturn_train"
ENTRY_POINTS = {"cli.py"}  # entry points resolve the name `testbed`; the testbed package itself is a user of the core


def imports_of_testbed(path: Path) -> list[str]:
    """The import statements of `path` (at module level or inside functions) that reach `uturn_train.testbed`."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # how many dots lead back to the package
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("uturn_train.testbed")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the package
                if node.level - 1 > depth:
                    continue
                base = ["uturn_train", *path.relative_to(PACKAGE).parts[:-1]][: depth + 2 - node.level]
                module = ".".join([*base, module] if module else base)
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            found += [n for n in names if n == "uturn_train.testbed" or n.startswith("uturn_train.testbed.")][:1]
    return found


def core_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if "testbed" not in p.relative_to(PACKAGE).parts and p.name not in ENTRY_POINTS]


def test_the_scan_finds_imports_of_testbed(tmp_path):
    assert imports_of_testbed(PACKAGE / "cli.py"), "the CLI resolves `testbed`: the scan must see that import"


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_module_does_not_import_the_testbed(path):
    assert not imports_of_testbed(path), f"{path.relative_to(PACKAGE)} imports {imports_of_testbed(path)}"


def test_loaders_never_build_the_testbed(tmp_path, monkeypatch):
    from uturn_train.data import CollabDataArguments, load_conversations
    from uturn_train.mining import MiningArguments, mining_examples
    from uturn_train.tasks import load_task

    monkeypatch.setenv("UTURN_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match="pass its heldout.jsonl as data"):
        load_task("testbed")
    with pytest.raises(ValueError, match="pass it as mine_data"):
        mining_examples(MiningArguments(mine_source="testbed"))
    with pytest.raises(ValueError, match="pass it as collab_data"):
        load_conversations(CollabDataArguments(collab_source="testbed"))
    assert not (tmp_path / "home").exists()
