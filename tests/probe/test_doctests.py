"""The examples in the docstrings that define the probe's concepts run as written (doctest)."""

import doctest
import importlib

import pytest

MODULES = ["uturn_train.probe.rules.classify", "uturn_train.probe.rules.grounding", "uturn_train.probe.rules.text",
           "uturn_train.probe.record"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for test in doctest.DocTestFinder().find(module):
        for example in test.examples:  # the docstrings fence their examples as Markdown: the fence is no output
            example.want = example.want.removesuffix("```\n")
        runner.run(test)
    failed, attempted = runner.summarize(verbose=False)
    assert attempted, f"{name} has no examples to run"
    assert not failed, f"{failed} of {attempted} examples of {name} fail"
