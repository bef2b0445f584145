"""Modules that moved in 0.2 (issue 35), importable under their old names until the next release, with a warning.

`import uturn_train.mining` gives `uturn_train.training.mining` itself (one module object, so monkeypatching and
`isinstance` keep working) and a `FutureWarning` that names the new path.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "uturn_train.callback": "uturn_train.training.callback",
    "uturn_train.selection": "uturn_train.training.selection",
    "uturn_train.mining": "uturn_train.training.mining",
    "uturn_train.data": "uturn_train.training.data",
    "uturn_train.rl_data": "uturn_train.training.rl_data",
    "uturn_train.rewards": "uturn_train.training.rewards",
    "uturn_train.plan": "uturn_train.commands.plan",
    "uturn_train.ablate": "uturn_train.experiments.ablate",
    "uturn_train.ablate_config": "uturn_train.experiments.ablation_file",
    "uturn_train.report": "uturn_train.experiments.report",
    "uturn_train.report_seeds": "uturn_train.experiments.seeds",
    "uturn_train.report_md": "uturn_train.experiments.markdown",
    "uturn_train.qwen3_5_2b": "uturn_train.zoo.qwen3_5_2b",
    "uturn_train.probe.classify": "uturn_train.probe.rules.classify",
    "uturn_train.probe.cues": "uturn_train.probe.rules.cues",
    "uturn_train.probe.degenerate": "uturn_train.probe.rules.degenerate",
    "uturn_train.probe.word_problem": "uturn_train.probe.rules.word_problem",
    "uturn_train.probe.grounding": "uturn_train.probe.rules.grounding",
    "uturn_train.probe.judge": "uturn_train.probe.labelers.llm_judge",
    "uturn_train.probe.labels": "uturn_train.probe.labelers.policy",
    "uturn_train.probe.scorer": "uturn_train.probe.labelers.scorer",
    "uturn_train.probe.agreement": "uturn_train.probe.validity.agreement",
    "uturn_train.probe.validate": "uturn_train.probe.validity.perturbations",
    "uturn_train.probe.job": "uturn_train.commands.probe",
    "uturn_train.collab.job": "uturn_train.commands.collab",
}


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; the old name goes in the next release",
                      FutureWarning, stacklevel=2)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # the module it stands for is loaded already


def install() -> None:
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
