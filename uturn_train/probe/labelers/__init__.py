"""Labellers backed by a model, beside the rules: an LLM judge behind any OpenAI-compatible endpoint
(`llm_judge.py`), a fixed scorer model that confirms grounded turns (`scorer.py`), and the policy that says who labels
a probe's turns and what its rows and rates then say (`policy.py`)."""
