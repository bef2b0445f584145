"""OASST1 held-out triples: real (user query, assistant answer, user follow-up) paths from OpenAssistant trees.

Every prompter -> assistant -> prompter path of a conversation tree is one example: the query, a human-written
answer, and the follow-up a human really sent next (`reference_followup`). Deeper paths keep the turns above the
query in `meta["history"]` as `{"role": "user" | "assistant", "content"}` messages. Only English messages that are
not deleted are walked. Example from `en_100_tree.jsonl`:

    user:      How can I find the best 401k plan for my needs?
    assistant: The first step is to research your options. ...
    user:      (the real next user turn)
"""

from collections.abc import Iterable, Iterator
from itertools import chain

from .base import Example
from .jsonl import BadRow, require

ROLES = {"prompter": "user", "assistant": "assistant"}


def trees(rows: Iterable[tuple[str, dict]]) -> Iterator[tuple[str, dict]]:
    """Yields `(where, tree)`: tree rows (`{message_tree_id, prompt: {..., replies}}`) as they are, or flat message
    rows (the hub's `message_id`, `parent_id` format) nested into such trees."""
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        return
    rows = chain([first], rows)
    if "parent_id" not in first[1]:
        yield from rows
        return
    nodes = {}
    for where, message in rows:
        nodes[require(message, "message_id", where)] = {**message, "replies": [], "where": where}
    for node in nodes.values():
        # A message whose parent is absent (not in this split) cannot start a path from the tree's root.
        if node["parent_id"] in nodes:
            nodes[node["parent_id"]]["replies"].append(node)
    for node in nodes.values():
        if node["parent_id"] is None:
            yield node["where"], {"message_tree_id": node.get("message_tree_id"), "prompt": node}


def to_examples(tree: dict, where: str) -> list[Example]:
    """All prompter -> assistant -> prompter paths of one tree, depth first, in the order of the replies."""
    tree_id = tree.get("message_tree_id")
    examples = []

    def walk(node: dict, path: list[dict]) -> None:
        if node.get("lang", "en") != "en" or node.get("deleted"):
            return  # with its whole subtree: the rest of that conversation builds on this message
        at = f"{where} (message {node.get('message_id', '?')})"
        require(node, "text", at)
        if require(node, "role", at) not in ROLES:
            raise BadRow(f"{at}: field 'role' is {node['role']!r}, expected 'prompter' or 'assistant'")
        path = path + [node]
        if [n["role"] for n in path[-3:]] == ["prompter", "assistant", "prompter"]:
            query, answer, followup = path[-3:]
            examples.append(
                Example(
                    # The follow-up fixes the whole path up to the root, so its id is unique.
                    id=f"oasst-{require(followup, 'message_id', at)}",
                    query=query["text"],
                    answer=answer["text"],
                    reference_followup=followup["text"],
                    meta={
                        "history": [{"role": ROLES[n["role"]], "content": n["text"]} for n in path[:-3]],
                        "message_tree_id": tree_id,
                        "answer_message_id": answer.get("message_id"),
                    },
                )
            )
        for reply in node.get("replies") or []:
            walk(reply, path)

    walk(require(tree, "prompt", where), [])
    return examples
