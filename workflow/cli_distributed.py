"""`namsa perfmodel` and `namsa tuning`: the data-parallel performance model
(models.distributed.perfmodel) and the grid search of reduction knobs on this machine
(models.distributed.tuning), as subcommands of the one CLI (workflow.cli registers them).

Their parsers live here so the models room parses no command line; building them imports nothing
of the models room (torch), so every other command starts as fast as before. Where a flag is not
given, the model's own defaults apply (the paper's model, Summit's links). Each writes at most one
file (a fit, a figure, tuned settings), not an output directory, so neither takes an out lock.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

#: workflow.cli's ``add(name, handler, help)``: registers a subcommand and returns its parser
AddCommand = Callable[..., argparse.ArgumentParser]


def add_parsers(add: AddCommand) -> None:
    """Register `namsa perfmodel` (measure, scaling, coordination) and `namsa tuning`."""
    p = add("perfmodel", cmd_perfmodel, "the performance model of data-parallel training: fit the alpha-beta link "
            "here, predict scaling efficiency, compare coordination protocols (docs/distributed.md)")
    models = p.add_subparsers(dest="model", required=True, metavar="MODEL")
    _add_measure(models.add_parser("measure", help="time gloo allreduce vs size and rank count here; fit alpha/beta"))
    _add_scaling(models.add_parser("scaling",
                                   help="predicted scaling efficiency (default: the paper's model on Summit)"))
    _add_coordination(models.add_parser("coordination",
                                        help="master-worker vs bitvector coordination from 1 to N ranks"))
    _add_tuning(add("tuning", cmd_tuning, "time DDP bucket sizes, groupings and (with --horovod) Horovod's fusion "
                    "settings on this machine; write the fastest as a distributed.tuned_settings file"))


def _add_measure(m: argparse.ArgumentParser) -> None:
    m.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4])
    m.add_argument("--sizes", type=float, nargs="+", default=[4e3, 64e3, 1e6, 4e6], help="bytes")
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--out", type=Path, help="write the fit (JSON, for --fit) here")


def _add_scaling(s: argparse.ArgumentParser) -> None:
    s.add_argument("--nodes", type=int, nargs="+", default=None, help="node counts (default: the paper's)")
    s.add_argument("--gpus-per-node", type=int, default=None, help="(default: the paper's)")
    s.add_argument("--overlap", type=float, default=0.0, help="fraction of backward that hides communication")
    s.add_argument("--batch-per-gpu", type=int, default=1)
    s.add_argument("--step-s", type=float, help="measured single-GPU training step (s) of your job "
                   "(default: the paper's 5.151e13 ops per sample at 59.67 TFLOP/s)")
    size = s.add_mutually_exclusive_group()
    size.add_argument("--preset", choices=["tiny", "small", "paper"], help="gradient size of this model preset")
    size.add_argument("--params", type=int, help="gradient size in parameters (default: the paper's)")
    s.add_argument("--grad-bytes", type=int, default=2, choices=[2, 4], help="bytes per reduced gradient value")
    s.add_argument("--intra-alpha", type=float, default=None, help="in-node latency (s)")
    s.add_argument("--intra-bandwidth", type=float, default=None, help="in-node bandwidth per GPU (B/s)")
    _add_link(s)


def _add_coordination(c: argparse.ArgumentParser) -> None:
    c.add_argument("--max-ranks", type=int, default=27_600)
    c.add_argument("--groups", type=int, default=7)
    c.add_argument("--cycle-ms", type=float, default=5.0, help="budget per cycle (Horovod's default cycle time)")
    c.add_argument("--plot", type=Path)
    _add_link(c)


def _add_link(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alpha", type=float, default=None, help="inter-node latency (s)")
    p.add_argument("--bandwidth", type=float, default=None, help="node injection bandwidth (B/s)")
    p.add_argument("--fit", type=Path, help="JSON with alpha_s/beta_s_per_B (from `measure`) to use instead")


def _add_tuning(t: argparse.ArgumentParser) -> None:
    t.add_argument("--out", type=Path, required=True, help="write the tuned settings JSON here")
    t.add_argument("--ranks", type=int, default=2)
    t.add_argument("--steps", type=int, default=4)
    t.add_argument("--width", type=int, default=48)
    t.add_argument("--depth", type=int, default=6)
    t.add_argument("--preset", choices=["tiny", "small"], help="time this FC-DenseNet preset instead of BenchNet")
    t.add_argument("--px", type=int, default=32, help="pattern size for --preset")
    t.add_argument("--horovod", action="store_true", help="also tune Horovod fusion threshold / cycle time")


def cmd_perfmodel(args: argparse.Namespace) -> int:
    from models.distributed import perfmodel as pm
    from stage.jsonfile import write_json_atomic

    if args.model == "measure":
        result = pm.measure_fit(args.sizes, args.ranks, args.repeats)
        print(pm.fit_line(result))
        if args.out:
            write_json_atomic(args.out, result)
    elif args.model == "scaling":
        intra = pm.link_from(args.intra_alpha, args.intra_bandwidth, assumed=pm.SUMMIT_INTRA)
        print(pm.scaling_text(tuple(args.nodes or pm.PAPER_NODES), args.gpus_per_node or pm.PAPER_GPUS_PER_NODE,
                              pm.gradient_parameters(args.params, args.preset), args.grad_bytes, args.batch_per_gpu,
                              args.overlap, intra, pm.link_from(args.alpha, args.bandwidth, args.fit), args.step_s))
    else:
        print(pm.coordination_text(args.max_ranks, args.groups, pm.link_from(args.alpha, args.bandwidth, args.fit),
                                   args.cycle_ms, args.plot))
    return 0


def cmd_tuning(args: argparse.Namespace) -> int:
    from models.distributed.tuning import tune
    from stage.jsonfile import write_json_atomic

    result = tune(args.ranks, args.steps, args.width, args.depth, args.preset, args.px, args.horovod)
    write_json_atomic(args.out, result, make_parents=True)
    print(f"best settings {result['best']} -> {args.out} (set distributed.tuned_settings: {args.out})")
    return 0
