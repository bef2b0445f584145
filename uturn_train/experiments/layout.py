"""The files of an ablation folder: what `uturn ablate` writes and `uturn report` reads, named once for both.

    <out>/ablation.json                 PLAN: every run of the file, so the report knows runs that never finished
    <out>/<run>/train.log               LOG: the run's output
    <out>/<run>/ablation_run.json       MARKER: command, exit code, times; written atomically when the run exits
    <out>/<run>/pairs/mining_card.json  CARD: a DPO run's mining card (`training.mining.CARD` in the pairs folder)
"""

PLAN = "ablation.json"
LOG = "train.log"
MARKER = "ablation_run.json"
CARD = "pairs/mining_card.json"
