from types import SimpleNamespace

import pytest

from uturn_train.tracking import name_run_by_seed


@pytest.mark.parametrize("given, seed, named", [
    ("testbed-collab-dpo", 3, "testbed-collab-dpo-seed3"),   # a YAML's name, run with --seed 3
    ("dpo-sigmoid-seed1", 1, "dpo-sigmoid-seed1"),           # the ablation names its runs by seed already
    (None, 2, None),                                         # no name: W&B picks one
])
def test_runs_are_named_by_their_seed(given, seed, named):
    args = SimpleNamespace(run_name=given, seed=seed)
    name_run_by_seed(args)
    assert args.run_name == named
