"""`uturn judge`: fit the trained judge on the dev split of the turns labelled by reading, and measure it on the test
split ([`~uturn_train.probe.labelers.judge_training`]).

    uturn judge train                              # writes uturn_train/probe/labelers/judge_v5.json (the shipped one)
    uturn judge eval [--weights FILE] [--out DIR]  # the test split's figures, per source and task x temperature
"""

import argparse
from pathlib import Path

from ..probe.labelers.judge import NAME, WEIGHTS
from . import OUTPUT_ALIASES, dashed_aliases, parse_args


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uturn judge", description="The trained judge: fit on dev, measure on test.")
    parser.add_argument("action", choices=["train", "eval"])
    parser.add_argument("--weights", default=str(WEIGHTS), help="the judge's weights file (written by train)")
    parser.add_argument("--shared_data", default=None, help="the real data sets (default: ../shared/data)")
    parser.add_argument("--feature_model", default="smollm2-135m-instruct",
                        help="the fixed model whose likelihoods the judge reads (train; eval reads the weights')")
    parser.add_argument("--cache", default=None, help="feature cache (default: $UTURN_HOME/judge_features.jsonl)")
    parser.add_argument("--out", OUTPUT_ALIASES[0], dest="out",
                        default="outputs/judge", help="eval: where judge_eval.json and .md go")
    return dashed_aliases(parser)


def main(argv: list[str]) -> None:
    import json

    import torch

    from ..io import ensure_writable_dir, write_json
    from ..models import load_model, load_tokenizer
    from ..probe.labelers.features import TurnLikelihoods
    from ..probe.labelers.judge import Judge
    from ..probe.labelers.judge_training import compare, features, learning_curve, train_judge
    from ..probe.validity.reading import DATA, ROOT, load_reading, pair_contexts
    from ..testbed import testbed_dir
    from ..zoo import resolve

    args = parse_args(make_parser(), argv)
    shared = Path(args.shared_data or ROOT.parent / "shared" / "data")
    if not (shared / "README.md").exists():
        raise ValueError(f"--shared_data {shared}: the real data sets are not there (see ../shared/data/README.md)")
    cache = Path(args.cache) if args.cache else testbed_dir().parent / "judge_features.jsonl"
    rows = load_reading(shared)
    pair_contexts(rows)
    weights_path = Path(args.weights)
    name = args.feature_model if args.action == "train" else json.loads(weights_path.read_text())["feature_model"]
    folder = argparse.Namespace(model=name)
    resolve(folder)
    likelihoods = TurnLikelihoods(load_model(folder.model, dtype="float32"), load_tokenizer(folder.model))
    print(f"{len(rows)} turns labelled by reading; CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    if args.action == "train":
        weights = train_judge(rows, likelihoods, weights_path, cache, name,
                              NAME if weights_path.resolve() == WEIGHTS.resolve() else None)
        print(f"wrote {weights_path}: fitted on {weights['trained_on']['rows']} dev turns in {weights['seconds']:.0f} "
              f"s; cross-validated {json.dumps(weights['cross_validation'])}")
        return
    dev, test = ([r for r in rows if r["split"] == split] for split in ("dev", "test"))
    weights = json.loads(weights_path.read_text())
    x_dev, x_test = features(dev, likelihoods, cache), features(test, likelihoods, cache)
    judge = Judge(weights, likelihoods)
    verdicts = judge.predict(x_test)
    report = {"weights": str(weights_path), "cpu": torch.backends.cpu.get_cpu_capability(),
              "decisions": compare(dev, x_dev, test, x_test, weights),
              "readers": readers_agreement(test, verdicts, DATA / "second_reader.jsonl"),
              "learning_curve": learning_curve(dev, x_dev, test, x_test, weights["cross_validation"])}
    out = ensure_writable_dir(args.out)
    write_json(out / "judge_eval.json", report)
    text = markdown(report)
    (out / "judge_eval.md").write_text(text)
    print(text)


def readers_agreement(test: list[dict], verdicts, second_file: Path) -> dict | None:
    """Cohen's kappa (label, grounded) of the second reader with the first, and of the judge with each, on the test
    turns both read."""
    from ..io import read_jsonl
    from ..probe.validity.agreement import cohen_kappa

    if not second_file.exists():
        return None
    second = {r["row"]: r for r in read_jsonl(second_file, ("row", "label"))}
    both = [(r, v, second[r["row"]]) for r, v in zip(test, verdicts) if r["row"] in second]
    if len(both) < len(second):
        raise ValueError(f"{second_file}: {len(second) - len(both)} rows are not test turns of the labelled set")

    def kappa(a, b):
        return {"label": cohen_kappa([x["label"] for x in a], [x["label"] for x in b]),
                "grounded": cohen_kappa([str(bool(x["grounded"])) for x in a], [str(bool(x["grounded"])) for x in b])}

    first, judged, other = ([t[0] for t in both], [{"label": t[1].label, "grounded": t[1].grounded} for t in both],
                            [t[2] for t in both])
    return {"n": len(both), "readers": kappa(first, other), "judge_first": kappa(judged, first),
            "judge_second": kappa(judged, other)}


def _f(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(report: dict) -> str:
    """The test split's table: per cell, the judge's follow-up and grounded precision/recall, kappas and grounded rate
    against reading, with the rules', the linear heads' and the two smaller fits' grounded precision/recall beside."""
    others = ("rules", "linear heads", "without states", "without likelihoods")
    lines = [f"Test split, weights {report['weights']} (CPU {report['cpu']}).", "",
             "| turns | n | follow-up P | R | grounded P | R | kappa label / grounded | grounded: read | judge | "
             "rules | grounded P / R: rules | linear heads | no-state fit | no-LM fit |", "|" + "---|" * 14]
    cells = report["decisions"]
    for name, m in cells["judge"].items():
        pr = [f"{_f(cells[o][name]['grounded']['precision'])} / {_f(cells[o][name]['grounded']['recall'])}"
              for o in others]
        lines.append(f"| {name} | {m['n']} | {_f(m['followup']['precision'])} | {_f(m['followup']['recall'])} | "
                     f"{_f(m['grounded']['precision'])} | {_f(m['grounded']['recall'])} | {_f(m['kappa_label'])} / "
                     f"{_f(m['kappa_grounded'])} | {_f(m['grounded_rate_read'])} | {_f(m['grounded_rate_decided'])} | "
                     f"{_f(cells['rules'][name]['grounded_rate_decided'])} | {' | '.join(pr)} |")
    if report["readers"]:
        a = report["readers"]
        lines += ["", f"Second reader on {a['n']} test turns, Cohen's kappa label / grounded: readers "
                  f"{_f(a['readers']['label'])} / {_f(a['readers']['grounded'])}; judge with the first reader "
                  f"{_f(a['judge_first']['label'])} / {_f(a['judge_first']['grounded'])}, with the second "
                  f"{_f(a['judge_second']['label'])} / {_f(a['judge_second']['grounded'])}."]
    lines += ["", "| dev share | rows | follow-up P / R | grounded P / R | kappa grounded |", "|---|---|---|---|---|"]
    for c in report["learning_curve"]:
        lines.append(f"| {c['share']:g} | {c['rows']} | {_f(c['followup']['precision'])} / "
                     f"{_f(c['followup']['recall'])} | {_f(c['grounded']['precision'])} / "
                     f"{_f(c['grounded']['recall'])} | {_f(c['kappa_grounded'])} |")
    return "\n".join(lines) + "\n"
