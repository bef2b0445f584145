"""How a probe decodes: one dataclass, used as is by `uturn probe` and under a prefix by the recipes and mining.

TrlParser merges dataclasses by field name, and TRL's configs have fields of the same names (`seed`, `temperature`...),
so the recipes take these settings as `probe_*` (the callback) and `mine_*` (mining): [`prefixed`] derives those
dataclasses from [`ProbeSettings`] instead of spelling the fields out again.

The labeler fields choose who labels the user turns: the rule classifier, the trained judge
([`~uturn_train.probe.labelers.judge.Judge`], shipped), an LLM judge ([`~uturn_train.probe.labelers.llm_judge.Judge`],
any OpenAI-compatible endpoint), or the rules and an LLM judge side by side. The default, `auto`, is the rules on the
testbed, where they agree with reading on its own labelled turns, and the trained judge on every other task
([`labeler_for`]; the entry points resolve it, `zoo.resolve`). Mining and the GRPO reward take `rules` or `trained`
only (`mine_labeler`, `reward_labeler`): an LLM judge asked for every sampled turn of a training run is not offline.
"""

import dataclasses
from dataclasses import dataclass, field

SETTINGS = ("self", "heldout")
LABELERS = ("auto", "rules", "trained", "judge", "both")
OFFLINE_LABELERS = ("auto", "rules", "trained")  # mining and the GRPO reward
LABELER_OPTIONS = ("labeler", "probe_labeler", "mine_labeler", "reward_labeler")
TASK_OPTIONS = ("task", "probe_task", "mine_source", "prompt_source")  # the task a labeler `auto` is chosen by
JUDGE_FIELDS = ("labeler", "judge_base_url", "judge_model", "judge_api_key_env", "judge_concurrency",
                "judge_cache_dir")


@dataclass
class ProbeSettings:
    """What the probe generates and how.

    Args:
        setting (`str`, *optional*, defaults to `"self"`): `self` (the model answers the query greedily, then writes the
            user turn) or `heldout` (the answer comes from the data).
        temperatures (`list[float]`, *optional*, defaults to `[0.0, 1.0]`): 0 = greedy, one user turn per prompt; any
            other temperature samples `samples` user turns per prompt. Empty: answers (and accuracy) only.
        samples (`int`, *optional*, defaults to `4`): user turns per prompt at each temperature above 0.
        max_new_tokens (`int`, *optional*, defaults to `256`): token limit of a user turn.
        answer_max_new_tokens (`int`, *optional*, defaults to `512`): token limit of an answer (self setting).
        batch_size (`int`, *optional*, defaults to `16`): prompts per `generate` call.
        seed (`int`, *optional*, defaults to `0`): sampling seed; also seeds the mismatched contexts of the grounded
            decision.
        enable_thinking (`bool`, *optional*, defaults to `False`): render prompts with thinking on (Qwen3-style
            templates).
        labeler (`str`, *optional*, defaults to `"auto"`): who labels the user turns: `auto` (`rules` on the testbed,
            `trained` on every other task: [`labeler_for`]), `rules` (the offline classifier), `trained` (the trained
            judge `uturn-judge-v5`, offline, on a fixed SmolLM2-135M-Instruct; `label`, `grounded` and the rates are
            its, the rules' ride along as `rules_label`...), `judge` (an LLM judge; `label` and the rates are its,
            `rules_label` stays on each sample) or `both` (`label` and the rates are the rules', the judge's ride
            along as `judge_label`... and a nested `judge` summary per temperature).
        judge_base_url (`str`, *optional*): the judge's OpenAI-compatible API root, e.g. `https://api.openai.com/v1`.
        judge_model (`str`, *optional*): the judge model's name, as the endpoint lists it.
        judge_api_key_env (`str`, *optional*, defaults to `"OPENAI_API_KEY"`): the environment variable that holds
            the judge's key (the key itself is never an option, nor written anywhere).
        judge_concurrency (`int`, *optional*, defaults to `4`): judge requests in flight at once.
        judge_cache_dir (`str`, *optional*): the judge's verdict cache; defaults to `$UTURN_HOME/judge_cache`.
        scorer (`str`, *optional*): a fixed model (folder, `.gguf`, or `smollm2-135m-instruct`) whose likelihoods
            must confirm that a rule-grounded turn reacts to its own answer (`probe/labelers/scorer.py`). After
            open-ended answers the rules over-count a real model's grounded turns and the scorer under-counts them:
            report both (docs/probe.md, A real model).
    """

    setting: str = field(default="self", metadata={"help": "self (the model answers first) or heldout."})
    temperatures: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={"help": "0 = greedy."})
    samples: int = field(default=4, metadata={"help": "User turns per prompt at each temperature > 0."})
    max_new_tokens: int = field(default=256, metadata={"help": "Token limit of a user turn."})
    answer_max_new_tokens: int = field(default=512, metadata={"help": "Token limit of an answer (self setting)."})
    batch_size: int = field(default=16, metadata={"help": "Prompts per generate call."})
    seed: int = field(default=0, metadata={"help": "Sampling seed."})
    enable_thinking: bool = field(default=False, metadata={"help": "Render prompts with thinking on (Qwen3.5)."})
    labeler: str = field(default="auto", metadata={
        "help": "auto (rules on the testbed, trained elsewhere), rules, trained (the trained judge), judge (an LLM "
                "judge) or both (rules and the LLM judge)."})
    judge_base_url: str | None = field(default=None, metadata={"help": "The judge's OpenAI-compatible API root."})
    judge_model: str | None = field(default=None, metadata={"help": "The judge model's name."})
    judge_api_key_env: str = field(default="OPENAI_API_KEY",
                                   metadata={"help": "Environment variable holding the judge's key."})
    judge_concurrency: int = field(default=4, metadata={"help": "Judge requests in flight at once."})
    judge_cache_dir: str | None = field(default=None,
                                        metadata={"help": "Judge verdict cache (default $UTURN_HOME/judge_cache)."})
    scorer: str | None = field(default=None, metadata={
        "help": "A fixed model whose likelihoods must confirm a grounded turn reacts to its answer "
                "(smollm2-135m-instruct or a folder): a lower bound where the rules give an upper (docs/probe.md)."})

    def __post_init__(self):
        if self.setting not in SETTINGS:
            raise ValueError(f"setting {self.setting!r} is not one of {SETTINGS}")
        if any(t < 0 for t in self.temperatures):
            raise ValueError(f"temperatures must be >= 0 (0 = greedy), got {list(self.temperatures)}")
        for name in ("samples", "max_new_tokens", "answer_max_new_tokens", "batch_size", "judge_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.labeler not in LABELERS:
            raise ValueError(f"labeler {self.labeler!r} is not one of {LABELERS}")
        if self.labeler in ("judge", "both") and not (self.judge_base_url and self.judge_model):
            raise ValueError(f"labeler {self.labeler!r} needs judge_base_url and judge_model (an OpenAI-compatible "
                             "endpoint and the model it serves); or use labeler rules or trained")

    def for_task(self, task: str | None) -> "ProbeSettings":
        """These settings with a labeler `auto` chosen for `task` ([`labeler_for`]); the probe runs resolved ones."""
        return dataclasses.replace(self, labeler=labeler_for(self.labeler, task))


def labeler_for(labeler: str, task: str | None) -> str:
    """`labeler` with `auto` chosen by the task: the rules on the testbed (they agree with reading on its labelled
    turns, `eval/real_model_validity.py`), the trained judge elsewhere (after open-ended answers the rules count a
    real model's grounded turns several times over: `probe/labelers/judge_v5.md`)."""
    if labeler != "auto":
        return labeler
    return "rules" if task == "testbed" else "trained"


def resolve_labelers(*configs) -> None:
    """Set every `labeler` field (`labeler`, `probe_labeler`, `mine_labeler`, `reward_labeler`) that says `auto` in
    `configs` (parsed dataclasses) by [`labeler_for`] of the task option of the same group (`TASK_OPTIONS`)."""
    tasks = {name: getattr(c, name) for c in configs for name in TASK_OPTIONS if getattr(c, name, None) is not None}
    for config in configs:
        for name in LABELER_OPTIONS:
            if getattr(config, name, None) == "auto":
                task = tasks.get({"probe_labeler": "probe_task", "mine_labeler": "mine_source",
                                  "reward_labeler": "prompt_source"}.get(name, "task"))
                setattr(config, name, labeler_for("auto", task))



def prefixed(prefix: str, exclude: tuple[str, ...] = (), **defaults) -> type:
    """A dataclass with the fields of [`ProbeSettings`] named `prefix + name` (minus `exclude`), with other `defaults`.

    Subclass it to add fields; `settings()` turns an instance back into a validated `ProbeSettings`.
    """
    unknown = set(defaults) - {f.name for f in dataclasses.fields(ProbeSettings)}
    if unknown:
        raise ValueError(f"not ProbeSettings fields: {sorted(unknown)}")
    fields = []
    for f in dataclasses.fields(ProbeSettings):
        if f.name in exclude:
            continue
        value = defaults.get(f.name, f.default_factory() if f.default is dataclasses.MISSING else f.default)
        default = {"default_factory": lambda v=value: list(v)} if isinstance(value, list) else {"default": value}
        fields.append((prefix + f.name, f.type, field(**default, metadata=f.metadata)))

    def settings(self) -> ProbeSettings:
        return ProbeSettings(**{name[len(prefix):]: getattr(self, name) for name, _, _ in fields})

    def post_init(self):
        try:
            self.settings()  # bad values fail when the command line is parsed
        except ValueError as e:
            raise ValueError(f"{e} (as {prefix}* options)") from None

    return dataclasses.make_dataclass(f"{prefix}ProbeSettings", fields,
                                      namespace={"settings": settings, "__post_init__": post_init})
