"""Every relative link in the READMEs and docs/ leads to a file that exists and, with `#anchor`, to a heading of it
(GitHub's anchors: lower case, punctuation dropped, spaces as dashes): the README links to the pages its measurements
moved to (issue 38)."""

import re

from helpers import ROOT

DOCUMENTS = sorted([ROOT / "README.md", ROOT / "recipes" / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def broken(path, root=ROOT) -> list[str]:
    wrong = []
    for target in LINK.findall(path.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file, _, anchor = target.partition("#")
        where = (path.parent / file).resolve() if file else path
        if not where.exists():
            wrong.append(f"{path.relative_to(root)}: {target} (no such file)")
        elif anchor and where.suffix == ".md" and anchor not in anchors(where):
            wrong.append(f"{path.relative_to(root)}: {target} (no such heading)")
    return wrong


def test_every_relative_link_resolves():
    links = sum(len(LINK.findall(p.read_text(encoding="utf-8"))) for p in DOCUMENTS)
    assert links > 20, "the docs' links are no longer found"
    wrong = [w for p in DOCUMENTS for w in broken(p)]
    assert not wrong, "links that lead nowhere:\n" + "\n".join(wrong)


def test_a_wrong_link_would_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("## Qwen3.5-2B (GPU)\n[a](page.md#qwen35-2b-gpu) [b](page.md#qwen3.5-2b) [c](missing.md)\n")
    assert broken(page, tmp_path) == ["page.md: page.md#qwen3.5-2b (no such heading)",
                                      "page.md: missing.md (no such file)"]
