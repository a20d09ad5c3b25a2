"""`namsa`: the command line. Every subcommand is a thin layer over a runner in workflow.data_runners,
workflow.model_runners or workflow.reconstruct (the DAG of `namsa run`: workflow.pipeline).

    namsa simulate CONFIG --out DIR       structures -> LMDB store(s) + manifest
    namsa stage SRC DST                   copy/shard stores to node-local storage, verify
    namsa inspect DIR [--verify]          what a store holds; --verify checks every checksum
    namsa train CONFIG --data DIR --out DIR [--resume]
    namsa evaluate CONFIG --data DIR --model DIR|pretrained:<name> --out DIR
    namsa run CONFIG [--out DIR]          the whole Parsl DAG: simulate -> train -> evaluate
    namsa scaling CONFIG --data DIR --out DIR
    namsa reconstruct FILE --model DIR|pretrained:<name> --out DIR   an experimental 4D-STEM file -> maps
    namsa precompute CONFIG --data DIR    a split's ptychography into evaluation.baseline_cache, before any model
    namsa publish RUN NAME --out DIR | --into-package   a finished run's model + extended card as DIR/NAME
    namsa perfmodel measure|scaling|coordination   the data-parallel performance model (workflow.cli_distributed)
    namsa tuning --out FILE               time the reduction knobs here; the fastest as distributed.tuned_settings

CONFIG may be left out: the embedded quickstart config is used. The commands that read a CONFIG take
``--set key=value`` overrides; stage, inspect and reconstruct read none. Every failure is one line
``namsa: error: <what is wrong and how to fix it>``; bad input exits with status 2, a run or an
environment that failed with status 1 (workflow.errors says which is which).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

from namsa.errors import MemoryShortage, NamsaError

from . import child_status
from .cli_args import NoOverrides, Parser, ShippedModelsHelp, fractions, positive_float, step_pair, zone_axis
from .cli_distributed import add_parsers as add_distributed_parsers
from .errors import EXIT_FAILED, EXIT_INTERRUPTED, NothingSimulated, StageFailed, exit_status, out_of_memory
from .oserrors import os_error


def _load(args: argparse.Namespace):
    from .config import load_config

    return load_config(args.config, args.set or [])


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", default=None, metavar="CONFIG",
                        help="pipeline YAML (default: the embedded quickstart, configs/quickstart.yaml)")
    _add_overrides(parser)


def _add_overrides(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", default=[],
                        help="override one config value, e.g. --set training.max_steps=50 (repeatable; "
                             "the value is read as YAML)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bars (for logs and batch jobs)")


def _add_data_and_out(parser: argparse.ArgumentParser, out_help: str) -> None:
    """CONFIG, --set, --data (repeatable) and --out: the shape of train, evaluate and scaling."""
    _add_config(parser)
    parser.add_argument("--data", required=True, type=Path, action="append", help="data directory (repeatable)")
    parser.add_argument("--out", required=True, type=Path, help=out_help)
    _add_wait(parser)


def _add_wait(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait", action="store_true",
                        help="if another namsa command is writing the same --out, wait for it to finish "
                             "instead of exiting (one writer per output: its lock is <parent>/.<name>.lock)")


# --------------------------------------------------------------------------------------------
# subcommands


def cmd_simulate(args: argparse.Namespace) -> int:
    from . import data_runners

    cfg = _load(args)
    summary = data_runners.simulate(cfg, args.out, worker=args.worker, num_workers=args.of, progress=args.progress)
    print(summary.line())
    for who, why in summary.failed:
        print(f"  failed: {who}: {why}")
    _say_failures(summary.failed, produced=summary.written + summary.skipped,
                  listed_in=Path(args.out) / f"simulate-{args.worker:03d}.json")
    if summary.deadline_reached:
        print(f"namsa: warning: execution.simulate_deadline_s reached: {summary.not_reached} planned samples not "
              "simulated (not failures); run the same command again to continue", file=sys.stderr)
    return 0


def _say_failures(failed: Sequence[tuple[str, str]], produced: int, listed_in: Path) -> None:
    """Nothing produced: a one-line error (exit 2). Some failed: exit 0, but one line on stderr says so."""
    if not failed:
        return
    first = f"{failed[0][0]}: {failed[0][1]}"
    if produced == 0:
        raise NothingSimulated(f"no sample was simulated: all {len(failed)} planned samples or materials failed "
                               f"(the first: {first}); the full list is in {listed_in}")
    print(f"namsa: warning: {len(failed)} samples or materials failed and were skipped (the first: {first}); "
          f"the full list is in {listed_in}", file=sys.stderr)


def cmd_stage(args: argparse.Namespace) -> int:
    from . import data_runners

    report = data_runners.stage_data(args.src, args.dst, threads=args.threads, rank=args.rank,
                                     world_size=args.world_size, verify=args.verify, progress=args.progress)
    print(report.text())
    if report.ok:
        return 0
    print(f"namsa: error: staging {args.src} -> {args.dst}: {len(report.corrupt)} record(s) corrupt in the source "
          f"(not copied), {len(report.failed_verify)} failed verification in the destination; see the report "
          f"above, then re-simulate or re-stage those samples", file=sys.stderr)
    return EXIT_FAILED


def cmd_inspect(args: argparse.Namespace) -> int:
    from . import data_runners

    report = data_runners.inspect(args.path, verify=args.verify)
    report.require_readable()
    print(report.text())
    if report.ok:
        return 0
    print(f"namsa: error: {report.problems()}", file=sys.stderr)
    return EXIT_FAILED


def _hold(args: argparse.Namespace, out: Path | None = None, what: str = "output directory"):
    """The lock of ``--out`` (or ``out``) for this command: one writer per output (workflow.outlock)."""
    from .outlock import hold_output

    return hold_output(out if out is not None else args.out, f"namsa {args.command}", wait=args.wait, what=what)


def cmd_train(args: argparse.Namespace) -> int:
    import contextlib

    from . import model_runners

    cfg = _load(args)
    # Under torchrun/srun every rank runs this command on one --out: rank 0 holds the lock for all.
    held = _hold(args) if model_runners.is_main_rank() else contextlib.nullcontext()
    with held:
        summary = model_runners.train(cfg, args.data, args.out, resume=args.resume, progress=args.progress)
    print(f"trained {summary['steps']} steps; model: {summary['model_dir']}; "
          f"best checkpoint: {summary['best_checkpoint']}; final dev loss: {summary['final_dev_loss']}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from . import model_runners
    from .summary import headline_lines

    cfg = _load(args)
    with _hold(args):
        summary = model_runners.evaluate(cfg, args.data, args.model, args.out)
    print(f"metrics: {summary['metrics_json']}\nreport: {summary['report_html']}")
    print("\n".join(headline_lines(summary["headline"], summary["verdicts"], summary.get("dose_sweep"))))
    for warning in summary.get("warnings", []):  # metrics missing for some samples (metrics.json "warnings")
        print(f"namsa: warning: {warning}", file=sys.stderr)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from .pipeline import run_pipeline
    from .run_paths import RunPaths

    cfg = _load(args)
    with _hold(args, RunPaths.for_config(cfg, args.out).root, what="run directory"):
        summary = run_pipeline(cfg, args.out, progress=args.progress, retry_failed=args.retry_failed)
    print(summary.text())
    _say_failures(summary.failures, produced=summary.available,
                  listed_in=Path(summary.run_dir) / "logs" / "simulate-failures.json")
    return 0


def cmd_scaling(args: argparse.Namespace) -> int:
    from . import model_runners

    cfg = _load(args)
    with _hold(args):
        result = model_runners.scaling(cfg, args.data, args.out, fractions=args.fractions, metric=args.metric,
                                        progress=args.progress)
    print(f"scaling study: {result.get('json')}\nfigure: {result.get('figure')}\nreport: {result.get('report')}")
    return 0


def cmd_reconstruct(args: argparse.Namespace) -> int:
    from .reconstruct import known_specimen, reconstruct

    specimen = known_specimen(args.specimen, args.zone_axis)  # a bad name fails before the scan is read
    given = {"energy_kv": args.energy_kv, "semiangle_mrad": args.semiangle_mrad, "dk_inv_A": args.dk_inv_a,
             "dk_mrad": args.dk_mrad, "step_A": args.scan_step_a, "detector_psf_px": args.detector_psf_px}
    with _hold(args):
        summary = reconstruct(args.file, args.model, args.out, calibrations=given, memory_gb=args.memory_gb,
                              refine=args.refine, symmetry_average=args.symmetry_average, specimen=specimen)
    height, width = summary["shape"]
    print(f"reconstructed {height} x {width} maps at {summary['pixel_size_A'][0]:.4g} x "
          f"{summary['pixel_size_A'][1]:.4g} Angstrom/px into {summary['out']} "
          f"(reconstruction.json lists the calibrations used and where each came from)")
    for note in summary["notes"]:
        print(f"  resampled: {note}")
    if summary.get("thickness"):   # a measurement, not a finding: inside the training range it warns of nothing
        print(f"  specimen thickness: {summary['thickness']}")
    for warning in summary.get("warnings", []):  # checks of the data and the maps (reconstruction.json)
        print(f"namsa: warning: {warning}", file=sys.stderr)
    return 0


def cmd_precompute(args: argparse.Namespace) -> int:
    from evaluation.precompute import precompute

    cfg = _load(args)
    count = precompute(cfg.evaluation, args.data)
    print(f"precomputed the baselines of {count} {cfg.evaluation.split} samples into {cfg.evaluation.baseline_cache}")
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from .pretrained import PRETRAINED_ROOT, publish

    print(f"published {publish(args.run, args.name, PRETRAINED_ROOT if args.into_package else args.out)}")
    return 0


# --------------------------------------------------------------------------------------------
# the parser


#: the --model help of evaluate and reconstruct (``{shipped}``: see ShippedModelsHelp)
_MODEL_HELP = ("a trained model directory (the --out of `namsa train`, or its model/), or pretrained:<name> for "
               "a reconstructor shipped with namsa; shipped: {shipped} (models.pretrained_names())")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="namsa", description="Multislice 4D-STEM simulation -> LMDB stores -> FC-DenseNet "
        "reconstructor -> evaluation, as single stages or as one Parsl workflow.",
        epilog="Start with: namsa run configs/quickstart.yaml --out runs/quickstart")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Callable[[argparse.Namespace], int], help_text: str,
            formatter: type[argparse.HelpFormatter] = argparse.HelpFormatter) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, formatter_class=formatter)
        p.set_defaults(handler=handler)
        return p

    p = add("simulate", cmd_simulate, "simulate the config's samples into LMDB stores (one per worker)")
    _add_config(p)
    p.add_argument("--out", required=True, type=Path, help="data directory; this worker writes DIR/store-<worker>")
    p.add_argument("--worker", type=int, default=0, help="this worker's index (0-based) when splitting the plan (default 0)")
    p.add_argument("--of", type=int, default=1, help="number of workers the plan is split over (default 1: this worker simulates it all)")

    p = add("stage", cmd_stage, "copy/shard stores to node-local storage and verify every record")
    p.add_argument("src", type=Path, help="a store or a data directory of stores")
    p.add_argument("dst", type=Path, help="destination directory (e.g. $TMPDIR/namsa)")
    p.add_argument("--no-verify", dest="verify", action="store_false", help="skip the checksum pass")
    p.add_argument("--threads", type=int, default=4, help="reader threads feeding the writer (default 4)")
    p.add_argument("--rank", type=int, default=0, help="with --world-size: stage this rank's shard only")
    p.add_argument("--world-size", type=int, default=1, help="re-shard the samples over this many ranks")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

    p = add("inspect", cmd_inspect, "show what a store (or a data directory of stores) holds")
    p.add_argument("path", type=Path, help="a store or a data directory of stores")
    p.add_argument("--verify", action="store_true", help="check every record's checksum")

    p = add("train", cmd_train, "train the reconstructor on stores (single process, or under torchrun/MPI)")
    _add_data_and_out(p, "training output directory (checkpoints, metrics)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out")

    p = add("evaluate", cmd_evaluate, "evaluate a trained model against the baselines; writes metrics and a report",
            ShippedModelsHelp)
    _add_data_and_out(p, "output directory (metrics.json, figures, report.html)")
    p.add_argument("--model", required=True, type=Path, metavar="DIR|pretrained:<name>", help=_MODEL_HELP)

    p = add("run", cmd_run, "run the whole Parsl workflow: simulate -> train -> evaluate (resumable)")
    _add_config(p)
    p.add_argument("--out", type=Path, default=None, help="run directory (default: runs/<name>)")
    p.add_argument("--retry-failed", action="store_true", help="try again the samples that failed in earlier runs")
    _add_wait(p)

    p = add("scaling", cmd_scaling, "train on growing subsets of the data and plot error vs training-set size")
    _add_data_and_out(p, "output directory of the study")
    p.add_argument("--fractions", type=fractions, default=[0.125, 0.25, 0.5, 1.0],
                   help="comma-separated training-set fractions (default 0.125,0.25,0.5,1)")
    p.add_argument("--metric", default="rel_l2", help="metric plotted against the training-set size (default rel_l2)")

    p = add("reconstruct", cmd_reconstruct, "reconstruct the potential and density maps of an experimental 4D-STEM "
            "file (EMD/HDF5, .hspy, MIB, EMPAD, ... through rosettasciio) with a trained model, plus iCoM. It reads "
            "no pipeline config, so it takes no --set: its flags and the model's card are its settings",
            ShippedModelsHelp)
    p.add_argument("file", type=Path, metavar="FILE", help="4D-STEM file: (scan_y, scan_x, ky, kx) data")
    p.add_argument("--model", required=True, metavar="DIR|pretrained:<name>", help=_MODEL_HELP)
    p.add_argument("--out", required=True, type=Path, help="output directory (maps as NPY/TIFF, PNG, JSON)")
    _add_wait(p)
    for flag, meta, what in (("--energy-kv", "KV", "beam energy (kV)"),
                             ("--semiangle-mrad", "MRAD", "probe convergence semi-angle (mrad)"),
                             ("--dk-inv-a", "INV_A", "detector pixel size (1/Angstrom)"),
                             ("--dk-mrad", "MRAD", "detector pixel size (mrad; converted with the beam energy)"),
                             ("--scan-step-a", "A", "scan step (Angstrom; Y,X when they differ)")):
        p.add_argument(flag, type=step_pair if flag == "--scan-step-a" else positive_float, default=None, metavar=meta,
                       help=f"{what}; overrides the file's metadata")
    p.add_argument("--detector-psf-px", type=positive_float, default=None, metavar="SIGMA",
                   help="the camera's point spread: Gaussian sigma in detector pixels, from its MTF calibration (a "
                        "scintillator camera's, typically 0.5-1.5); every pattern is deconvolved from it "
                        "(Richardson-Lucy) before the model reads it (default: none, as for a direct detector)")
    p.add_argument("--specimen", default=None, metavar="NAME|CIF",
                   help="what the specimen is, when known: a structure namsa reads (a library id such as "
                        "NiO-rocksalt, or a CIF file); with --zone-axis its thickness is measured against its own "
                        "simulated PACBED series (median error 4%%, at most 17%% on the validation) instead of a "
                        "material-agnostic reference set (median 30%%); default: unknown")
    p.add_argument("--zone-axis", type=zone_axis, default=None, metavar="U,V,W",
                   help="the zone axis the specimen was tilted to (with --specimen), e.g. 0,1,1")
    p.add_argument("--memory-gb", type=positive_float, default=2.0, metavar="GB",
                   help="RAM to aim at (default 2): the scan is read in blocks of overlapping tiles of at most half "
                        "of it (at least one tile), so a scan of any number of positions fits; patterns too large for one tile in it are "
                        "refused before the first read, saying how far to bin them")
    p.add_argument("--refine", action="store_true",
                   help="refine each tile's potential by single-slice ptychography (py4DSTEM) started from the "
                        "network's map, kept only where it lowers the data error (slow: seconds to minutes per tile; "
                        "a tile whose map spans 0.75 rad of phase or more keeps the network's: it helps on specimens "
                        "thinner than about 50 Angstrom and leaves thicker ones nearly as the network made them)")
    p.add_argument("--single-pass", dest="symmetry_average", action="store_false",
                   help="run the network once per tile instead of averaging its maps over the scan's 8 rotations and "
                        "mirrors (8 times less network time; on the study's dev split the averaged maps' error is "
                        "about 15%% lower)")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="accepted for symmetry; no bar here")
    p.add_argument("--set", action=NoOverrides, help=argparse.SUPPRESS)

    p = add("precompute", cmd_precompute, "compute the ptychography baselines of the config's evaluation split into "
            "evaluation.baseline_cache before any model exists; `namsa evaluate` then reads them back")
    _add_config(p)
    p.add_argument("--data", required=True, type=Path, action="append", help="data directory (repeatable)")

    p = add("publish", cmd_publish, "publish a finished `namsa run` directory's model with an extended card "
            "(the physics it expects, its data, its held-out scores) as the folder NAME")
    p.add_argument("run", type=Path, metavar="RUN", help="a finished `namsa run` directory (model/, eval/, "
                   "config.resolved.yaml)")
    p.add_argument("name", metavar="NAME", help="the published folder's name (loads as pretrained:NAME when shipped)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--out", type=Path, help="write the model into DIR/NAME")
    where.add_argument("--into-package", action="store_true",
                       help="write into the source tree's models/pretrained/NAME, shipped with namsa (for maintainers)")
    add_distributed_parsers(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `namsa` console script; returns the exit status (`workflow.errors`)."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("namsa: interrupted; everything written so far is kept: rerun the same command to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except NamsaError as exc:
        return _report(exc)
    except OSError as exc:  # a full disk, a read-only or unwritable place: the system's word, and what to do
        return _report(os_error(args.command, exc, getattr(args, "out", None) or getattr(args, "dst", None)))
    except Exception as exc:  # what was written is kept (stores and checkpoints commit atomically)
        if not out_of_memory(exc):
            raise
        return _report(MemoryShortage(
            f"{args.command} ran out of memory; use smaller inputs (simulation.cell_lateral_A, simulation.thickness_A, "
            f"training.batch_size), fewer execution.workers, or a machine with more memory; rerun the same command "
            f"to resume"))


def _report(exc: NamsaError) -> int:
    """Print ``namsa: error: <one line>`` (and a failed stage's log tail below it); its exit status."""
    status = exit_status(exc)  # first: a class of no decided kind must fail loudly, not print a line
    print(f"namsa: error: {exc}", file=sys.stderr)
    child_status.record(status, str(exc))  # a `namsa run` that started this command keeps its kind
    if isinstance(exc, StageFailed) and exc.detail:
        print(exc.detail, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
