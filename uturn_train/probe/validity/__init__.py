"""Is the probe measuring what it claims? Its labels against turns labelled by reading (`human_turns.py`: real users'
next turns; `model_turns.py`: a real chat model's turns), agreement with reference labels (`agreement.py`,
`uturn agreement`) and controlled perturbations with predictable effects (`perturbations.py`, `uturn validate`)."""
