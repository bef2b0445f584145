"""The core takes paths: no core module imports the testbed or the zoo, and no loader starts a build or a fetch."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "uturn_train"
# What the entry points turn names into paths with; the testbed package and the zoo are users of the core.
RESOLVERS = ("uturn_train.testbed", "uturn_train.zoo")
# qwen3_5_2b.py builds its stand-in with the testbed's tokenizer, for the zoo: like the zoo, a user of the core.
ENTRY_POINTS = {"cli.py", "zoo.py", "qwen3_5_2b.py"}


def imports_of(path: Path, target: str) -> list[str]:
    """The import statements of `path` (at module level or inside functions) that reach the module `target`."""
    depth = len(path.relative_to(PACKAGE).parts) - 1  # how many dots lead back to the package
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == target or a.name.startswith(f"{target}.")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the package
                if node.level - 1 > depth:
                    continue
                base = ["uturn_train", *path.relative_to(PACKAGE).parts[:-1]][: depth + 2 - node.level]
                module = ".".join([*base, module] if module else base)
            names = [module] + [f"{module}.{a.name}" for a in node.names]
            found += [n for n in names if n == target or n.startswith(f"{target}.")][:1]
    return found


def core_modules() -> list[Path]:
    return [p for p in sorted(PACKAGE.rglob("*.py"))
            if "testbed" not in p.relative_to(PACKAGE).parts and p.name not in ENTRY_POINTS]


def test_the_scan_finds_imports_of_the_resolvers():
    assert imports_of(PACKAGE / "cli.py", "uturn_train.zoo"), "the CLI resolves names: the scan must see that import"
    assert imports_of(PACKAGE / "zoo.py", "uturn_train.testbed"), "the zoo delegates `testbed`: the scan must see it"


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_module_does_not_import_the_testbed_or_the_zoo(path):
    for target in RESOLVERS:
        assert not imports_of(path, target), f"{path.relative_to(PACKAGE)} imports {imports_of(path, target)}"


def test_loaders_never_build_or_fetch(tmp_path, monkeypatch):
    from uturn_train.data import CollabDataArguments, load_conversations
    from uturn_train.mining import MiningArguments, mining_examples
    from uturn_train.models import load_tokenizer
    from uturn_train.tasks import load_task

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
