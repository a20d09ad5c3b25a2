"""Publish a model trained outside `namsa run` (a benchmark's fine-tune, a device call's model) with its
held-out evaluation: the run directory `namsa publish` reads is assembled, checked and published.

    python scripts/publish_fine_tune.py MODEL_DIR EVAL_DIR NAME --config configs/gpu-study.yaml \\
        [--config-name camera-study] [--run runs/publish-NAME] (--out DIR | --into-package)

MODEL_DIR: the exported model folder (model.safetensors, model_card.json; a fine-tune's card carries its
chain, `training.lineage`); EVAL_DIR: `namsa evaluate --out` of the same weights on the test split (e.g.
benchmarks/study_rescore.py's eval-<name>); --config: the pipeline config whose simulation and data
sections the model was trained with (the card's `trained_on`; --config-name names it there). The run
directory (RUN/model, RUN/eval/metrics.json, RUN/config.resolved.yaml) is written to --run, a folder that
must not exist yet, and kept as the record of what was published. Refused in one line (exit 2): an
evaluation of other weights or of a split that is not held out, a --run that exists, and whatever
`namsa publish` refuses.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from namsa.errors import UserError  # noqa: E402


def assemble_run(model_dir: Path, eval_dir: Path, config: Path, config_name: str | None, run: Path) -> Path:
    """``run`` holding what `namsa publish` reads: a copy of ``model_dir``, ``eval_dir``'s metrics.json and
    ``config`` resolved (named ``config_name`` when given); the evaluation checked to be of these weights
    on a held-out split."""
    from models import checkpoint as ckpt
    from models.card import CARD_FILE, read_card_file
    from workflow.config import dump_config, load_config
    from workflow.publish_inputs import METRICS_FILE, read_metrics
    from workflow.rescore_card import check_held_out_evaluation

    if run.exists():
        raise UserError(f"{run} exists; choose a new --run folder (it is kept as the record of the publication)")
    metrics = read_metrics(eval_dir)
    check_held_out_evaluation(read_card_file(model_dir / CARD_FILE).files[ckpt.MODEL_FILE].xxh3_128, metrics,
                              eval_dir)
    cfg = load_config(config)
    if config_name:
        cfg = cfg.model_copy(update={"name": config_name})
    shutil.copytree(model_dir, run / "model")
    (run / METRICS_FILE).parent.mkdir(parents=True)
    shutil.copyfile(eval_dir / METRICS_FILE.name, run / METRICS_FILE)
    (run / "config.resolved.yaml").write_text(dump_config(cfg))
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("eval_dir", type=Path)
    ap.add_argument("name", help="the published folder's name (loads as pretrained:NAME when shipped)")
    ap.add_argument("--config", type=Path, required=True, help="the pipeline config it was trained with")
    ap.add_argument("--config-name", help="the config's name on the card (default: the config's own)")
    ap.add_argument("--run", type=Path, help="the run directory to assemble (default runs/publish-NAME)")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="publish into DIR/NAME")
    where.add_argument("--into-package", action="store_true", help="publish into models/pretrained/NAME")
    args = ap.parse_args(argv)
    from workflow.pretrained import PRETRAINED_ROOT, publish

    try:
        run = assemble_run(args.model_dir, args.eval_dir, args.config, args.config_name,
                           args.run or REPO / "runs" / f"publish-{args.name}")
        print(f"published {publish(run, args.name, PRETRAINED_ROOT if args.into_package else args.out)} from {run}")
    except UserError as exc:
        ap.exit(2, f"publish_fine_tune: error: {exc}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
