"""The unit of probe data: one conversation context to probe."""

from dataclasses import dataclass, field


@dataclass
class Example:
    """One probe item.

    Args:
        id (`str`): stable identifier, unique within a task.
        query (`str`): the user's first message.
        answer (`str`, *optional*): a real assistant answer (used by the heldout setting).
        gold (`str`, *optional*): the gold final answer, for tasks with one (GSM8K).
        reference_followup (`str`, *optional*): the real next user turn, when the data has one (OASST).
    """

    id: str
    query: str
    answer: str | None = None
    gold: str | None = None
    reference_followup: str | None = None
    meta: dict = field(default_factory=dict)
