"""Performance model of data-parallel training: alpha-beta collectives, You et al.'s linear
step-time predictor, scaling predictions for the paper's model, and coordination cost at scale.

Units: seconds, bytes, bytes/second; P = number of ranks (GPUs or processes).

* Alpha-beta (Hockney) model, as used by You et al. ("ImageNet Training in Minutes", 2018) and
  Thakur et al. (2005): sending n bytes costs alpha + n * beta. Ring allreduce:
  2(P-1) alpha + 2 (P-1)/P n beta; binomial-tree allreduce (reduce + broadcast):
  2 ceil(log2 P) (alpha + n beta). alpha/beta are fitted to measured allreduce times by
  non-negative least squares.
* You et al.'s linear predictor: t = theta0 + theta1 x1 + theta2 x2 with x1 the measured
  single-worker step (times ceil(P/cores) when ranks share cores) and x2 the alpha-beta time of
  the gradient allreduce; theta fitted on measured runs, judged on runs held out of the fit by a
  rule fixed before measuring (``split_runs``), error = mean absolute percentage error and max.
* Coordination per cycle: Horovod's original master-worker (rank 0 receives one request message
  from each of the P-1 workers in turn, then broadcasts the response down a binomial tree) vs the
  paper's bitvector (one tree allreduce of ceil(G/64) int64 words): the former grows linearly in
  P, the latter logarithmically.

From the command line: ``namsa perfmodel measure|scaling|coordination --help`` (workflow.cli_distributed).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from namsa.errors import UserError

# The paper's model and machine (FACTS.md; Laanait et al. 2019).
PAPER_PARAMS = 220_399_104
PAPER_OPS_PER_SAMPLE = 5.1510e13        # one training step per 1024 x 512 x 512 sample, 3x forward
PAPER_SUSTAINED_FLOPS = 59.67e12        # per V100, as measured in the paper
PAPER_GPUS_PER_NODE = 6
PAPER_NODES = (1, 8, 64, 512, 4600)
# Summit interconnect (OLCF Summit user guide): dual-rail EDR InfiniBand, 23 GB/s injection per
# node, ~1-2 us MPI latency; NVLink 2.0 at 50 GB/s between GPUs of a socket. Assumptions, not
# measurements: override them on the command line for another machine.
SUMMIT_INTER = {"alpha_s": 2.0e-6, "bandwidth_Bps": 23e9}
SUMMIT_INTRA = {"alpha_s": 5.0e-6, "bandwidth_Bps": 50e9}


@dataclass(frozen=True)
class AlphaBeta:
    """Latency ``alpha_s`` (s) and inverse bandwidth ``beta_s_per_B`` (s/byte)."""

    alpha_s: float
    beta_s_per_B: float

    @classmethod
    def from_bandwidth(cls, alpha_s: float, bandwidth_Bps: float) -> "AlphaBeta":
        return cls(alpha_s, 1.0 / bandwidth_Bps)

    def ring_allreduce(self, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        return 2 * (ranks - 1) * self.alpha_s + 2 * (ranks - 1) / ranks * nbytes * self.beta_s_per_B

    def tree_allreduce(self, nbytes: float, ranks: int) -> float:
        if ranks <= 1:
            return 0.0
        return 2 * math.ceil(math.log2(ranks)) * (self.alpha_s + nbytes * self.beta_s_per_B)

    def allreduce(self, nbytes: float, ranks: int) -> float:
        """The faster of ring and tree (what NCCL/MPI pick by message size)."""
        return min(self.ring_allreduce(nbytes, ranks), self.tree_allreduce(nbytes, ranks))


def ring_features(ranks: int, nbytes: float) -> tuple[float, float]:
    return 2.0 * (ranks - 1), 2.0 * (ranks - 1) / ranks * nbytes


def fit_alpha_beta(samples: list[tuple[int, float, float]]) -> tuple[AlphaBeta, float]:
    """Fit the ring model to ``(ranks, nbytes, seconds)`` samples by non-negative least squares,
    weighting each sample by 1/seconds (relative error). Returns the fit and its mean relative error."""
    rows = [s for s in samples if s[0] > 1]
    if len(rows) < 2:
        raise ValueError("need at least two allreduce timings with more than one rank")
    features = np.array([ring_features(p, n) for p, n, _ in rows])
    times = np.array([t for *_, t in rows])
    (alpha, beta), _ = nnls(features / times[:, None], np.ones(len(times)))
    fit = AlphaBeta(float(alpha), float(beta))
    predicted = np.array([fit.ring_allreduce(n, p) for p, n, _ in rows])
    return fit, float(np.mean(np.abs(predicted - times) / times))


@dataclass
class LinearStepModel:
    """You et al.: t = theta0 + theta1 * x1 + theta2 * x2 (x1 compute, x2 communication, seconds)."""

    theta: tuple[float, float, float]

    @classmethod
    def fit(cls, x1: np.ndarray, x2: np.ndarray, t: np.ndarray) -> "LinearStepModel":
        design = np.column_stack([np.ones_like(x1), x1, x2])
        theta, *_ = np.linalg.lstsq(design, t, rcond=None)
        return cls(tuple(float(v) for v in theta))

    def predict(self, x1, x2):
        return self.theta[0] + self.theta[1] * np.asarray(x1) + self.theta[2] * np.asarray(x2)


def step_features(compute_1_s: float, ranks: int, grad_bytes: float, link: AlphaBeta, cores: int) -> tuple[float, float]:
    """(x1, x2) of one run, in seconds: x1 = the measured single-worker step ``compute_1_s`` times
    ceil(P / cores), because with ranks bound to cores round-robin (``run_local(bind_cores=True)``,
    ``srun --cpu-bind=cores``) the busiest core time-slices ceil(P/cores) ranks and a synchronous
    step waits for its slowest rank (x1 = ``compute_1_s`` when every rank has a core of its own,
    You et al.'s assumption; unbound ranks migrate and share cores unpredictably); x2 = the
    alpha-beta ring time of one all_reduce of the ``grad_bytes`` gradient over P ranks."""
    return compute_1_s * math.ceil(ranks / cores), link.ring_allreduce(grad_bytes, ranks)


def prediction_errors(measured, predicted) -> dict[str, float]:
    """Mean absolute percentage error and max absolute relative error (fractions, not %)."""
    measured, predicted = np.asarray(measured, float), np.asarray(predicted, float)
    rel = np.abs(predicted - measured) / measured
    return {"mape": float(np.mean(rel)), "max": float(np.max(rel)), "n": int(rel.size)}


def held_out_widths(widths) -> set:
    """The held-out rule, fixed before any measurement: the widths (model sizes) at odd positions
    of the sorted distinct widths (2nd, 4th, ...), i.e. interpolation in model size. Every run of
    such a width is held out of the fit, whatever its batch or rank count."""
    return set(sorted(set(widths))[1::2])


def split_runs(runs: list[dict], rule: str, cores: int) -> tuple[list[dict], list[dict]]:
    """(fit, held-out) runs for a named rule. Runs are dicts with ``width``, ``ranks``.
    Single-rank runs are neither fitted nor judged: they supply x1, so they would predict
    themselves. Rules: ``"width"`` (held_out_widths) over runs with 2 <= P <= cores (dedicated
    cores); ``"width-all"`` the same over every P >= 2 (oversubscribed too); ``"max-ranks"`` all
    runs at the largest rank count held out (extrapolation in P)."""
    multi = [r for r in runs if r["ranks"] >= 2]
    if rule == "width":
        multi = [r for r in multi if r["ranks"] <= cores]
    if rule in ("width", "width-all"):
        out = held_out_widths(r["width"] for r in multi)
        test = lambda r: r["width"] in out  # noqa: E731
    elif rule == "max-ranks":
        top = max(r["ranks"] for r in multi)
        test = lambda r: r["ranks"] == top  # noqa: E731
    else:
        raise ValueError(f"unknown held-out rule {rule!r}")
    return [r for r in multi if not test(r)], [r for r in multi if test(r)]


def fit_and_judge(runs: list[dict], rule: str, cores: int) -> dict:
    """Fit You et al.'s model on the rule's fit runs (keys ``x1``, ``x2``, ``t``, seconds) and
    return theta, the held-out errors, and per-run predictions."""
    fit, held = split_runs(runs, rule, cores)
    model = LinearStepModel.fit(*(np.array([r[k] for r in fit]) for k in ("x1", "x2", "t")))
    rows = [{**r, "predicted": float(model.predict(r["x1"], r["x2"])), "in_fit": in_fit}
            for runs_, in_fit in ((fit, True), (held, False)) for r in runs_]
    errors = prediction_errors([r["t"] for r in rows if not r["in_fit"]], [r["predicted"] for r in rows if not r["in_fit"]])
    return {"rule": rule, "theta": model.theta, "rows": rows, "fit_runs": len(fit), **errors}


def hierarchical_allreduce(nbytes: float, nodes: int, per_node: int, intra: AlphaBeta, inter: AlphaBeta) -> float:
    """Kurth et al.: reduce-scatter + all-gather inside the node (ring over ``per_node`` GPUs) and a
    ring allreduce of each 1/per_node slice across nodes, the node's links shared by its GPUs."""
    inside = intra.ring_allreduce(nbytes, per_node)
    # per_node concurrent slices of nbytes/per_node share one node's injection bandwidth.
    shared = AlphaBeta(inter.alpha_s, inter.beta_s_per_B * per_node)
    return inside + shared.allreduce(nbytes / per_node, nodes)


def coordination_cycle(ranks: int, groups: int, link: AlphaBeta, request_bytes_per_group: int = 64) -> dict:
    """Seconds and messages of one readiness-coordination cycle with ``groups`` gradient groups.

    Master-worker: P-1 requests (one name per ready group, ~64 bytes) arrive at rank 0 one after
    another, then a binomial-tree broadcast of the response. Bitvector: one tree allreduce of
    ceil(groups/64) int64 words, every rank doing 2 ceil(log2 P) messages.
    """
    request = groups * request_bytes_per_group
    depth = math.ceil(math.log2(ranks)) if ranks > 1 else 0
    master = (ranks - 1) * (link.alpha_s + request * link.beta_s_per_B) + depth * (
        link.alpha_s + request * link.beta_s_per_B)
    words = 8 * math.ceil(groups / 64)
    bitvector = 2 * depth * (link.alpha_s + words * link.beta_s_per_B)
    return {"ranks": ranks, "master_worker_s": master, "bitvector_s": bitvector,
            "master_messages_at_root": 2 * (ranks - 1), "bitvector_messages_per_rank": 2 * depth}


def paper_scaling(nodes: tuple[int, ...] = PAPER_NODES, gpus_per_node: int = PAPER_GPUS_PER_NODE,
                  params: int = PAPER_PARAMS, bytes_per_grad: int = 2, ops_per_sample: float = PAPER_OPS_PER_SAMPLE,
                  flops_per_gpu: float = PAPER_SUSTAINED_FLOPS, batch_per_gpu: int = 1, overlap: float = 0.0,
                  groups: int = 7, cycles_per_step: int = 7, intra: AlphaBeta | None = None,
                  inter: AlphaBeta | None = None, compute_s: float | None = None) -> list[dict]:
    """Predicted weak-scaling efficiency t(1 GPU) / t(P), by default for the paper's model.

    t(P) = compute + max(0, allreduce + coordination - overlap * backward), backward = 2/3 of
    compute (the paper counts a step as 3 forwards: 1 forward + 2 in backward). ``compute_s``: a
    measured single-GPU step (s), as You et al. predict from; otherwise batch_per_gpu x
    ``ops_per_sample`` / ``flops_per_gpu``. Gradients of ``params`` values are fp16
    (``bytes_per_grad``=2, mixed precision as in the paper), reduced hierarchically.
    ``overlap``=0 exposes all communication (a pessimistic bound); 1 hides it behind backward.
    Coordination: ``cycles_per_step`` cycles (one per group in the worst case) with the bitvector or
    the master-worker protocol; the efficiency is given for both.
    """
    intra = intra or AlphaBeta.from_bandwidth(**SUMMIT_INTRA)
    inter = inter or AlphaBeta.from_bandwidth(**SUMMIT_INTER)
    compute = compute_s if compute_s is not None else batch_per_gpu * ops_per_sample / flops_per_gpu
    nbytes = params * bytes_per_grad
    rows = []
    for n in nodes:
        ranks = n * gpus_per_node
        comm = hierarchical_allreduce(nbytes, n, gpus_per_node, intra, inter)
        cycle = coordination_cycle(ranks, groups, inter)
        row = {"nodes": n, "gpus": ranks, "compute_s": compute, "allreduce_s": comm}
        for name in ("bitvector", "master_worker"):
            coord = cycles_per_step * cycle[f"{name}_s"]
            exposed = max(0.0, comm + coord - overlap * compute * 2 / 3)
            row[f"{name}_coord_s"] = coord
            row[f"efficiency_{name}"] = compute / (compute + exposed)
        rows.append(row)
    return rows


SCALING_COLUMNS = ["nodes", "gpus", "compute_s", "allreduce_s", "bitvector_coord_s", "master_worker_coord_s",
                   "efficiency_bitvector", "efficiency_master_worker"]
SCALING_FORMATS = {"compute_s": ".3f", "allreduce_s": ".4f", "bitvector_coord_s": ".2e",
                   "master_worker_coord_s": ".2e", "efficiency_bitvector": ".3f", "efficiency_master_worker": ".3f"}
COORDINATION_COLUMNS = ["ranks", "master_worker_s", "bitvector_s", "master_messages_at_root", "bitvector_messages_per_rank"]
COORDINATION_FORMATS = {"master_worker_s": ".2e", "bitvector_s": ".2e"}


def coordination_table(max_ranks: int = 27_600, groups: int = 7, link: AlphaBeta | None = None) -> list[dict]:
    link = link or AlphaBeta.from_bandwidth(**SUMMIT_INTER)
    ranks = sorted({1, 2, 6, 48, 384, 3072, 24_576, max_ranks} | {2 ** k for k in range(1, int(math.log2(max_ranks)) + 1)})
    return [coordination_cycle(p, groups, link) for p in ranks if p <= max_ranks]


def breakdown_rank(rows: list[dict], budget_s: float) -> int | None:
    """Smallest rank count at which master-worker coordination exceeds ``budget_s`` per cycle."""
    return next((r["ranks"] for r in rows if r["master_worker_s"] > budget_s), None)


def plot_coordination(rows: list[dict], path: Path, budget_s: float) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ranks = [r["ranks"] for r in rows[1:]]
    ax.loglog(ranks, [r["master_worker_s"] * 1e3 for r in rows[1:]], "o-", label="master-worker (rank 0)")
    ax.loglog(ranks, [r["bitvector_s"] * 1e3 for r in rows[1:]], "s-", label="bitvector allreduce")
    ax.axhline(budget_s * 1e3, color="grey", ls="--", label=f"cycle time {budget_s * 1e3:g} ms")
    ax.set_xlabel("ranks (GPUs)")
    ax.set_ylabel("coordination per cycle (ms)")
    ax.set_title("Readiness coordination on the alpha-beta model")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def markdown_table(rows: list[dict], columns: list[str], formats: dict[str, str] | None = None) -> str:
    formats = formats or {}
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(format(r[c], formats.get(c, "")) for c in columns) + " |")
    return "\n".join(lines)


def link_from(alpha_s: float | None = None, bandwidth_Bps: float | None = None, fit: Path | None = None,
              assumed: dict[str, float] = SUMMIT_INTER) -> AlphaBeta:
    """The link ``fit`` holds (the JSON of `measure_fit`: alpha_s, beta_s_per_B), else one of latency
    ``alpha_s`` and bandwidth ``bandwidth_Bps``, each ``assumed``'s (Summit's between nodes) where None."""
    if fit is not None:
        return _fitted_link(Path(fit))
    return AlphaBeta.from_bandwidth(assumed["alpha_s"] if alpha_s is None else alpha_s,
                                    assumed["bandwidth_Bps"] if bandwidth_Bps is None else bandwidth_Bps)


def _fitted_link(path: Path) -> AlphaBeta:
    try:
        data = json.loads(path.read_text())
        return AlphaBeta(float(data["alpha_s"]), float(data["beta_s_per_B"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path} is not a link fit (a JSON object with alpha_s and beta_s_per_B, as `namsa perfmodel "
                        f"measure --out` writes): {type(exc).__name__}: {exc}") from None


def preset_parameters(preset: str) -> int:
    """Learnable parameters of a model preset, counted on the meta device (no memory allocated)."""
    import torch

    from models import ModelConfig, build_model
    from models.fcdensenet import count_parameters

    with torch.device("meta"):
        return count_parameters(build_model(ModelConfig(preset=preset)))


def gradient_parameters(params: int | None = None, preset: str | None = None) -> int:
    """Gradient size in parameters: ``params``, else the model ``preset``'s, else the paper model's."""
    return params or (preset_parameters(preset) if preset else PAPER_PARAMS)


def scaling_text(nodes: tuple[int, ...], gpus_per_node: int, params: int, grad_bytes: int, batch_per_gpu: int,
                 overlap: float, intra: AlphaBeta, inter: AlphaBeta, step_s: float | None) -> str:
    """`paper_scaling` for these settings: a line saying them, a blank line, the markdown table."""
    rows = paper_scaling(tuple(nodes), gpus_per_node, params, grad_bytes, batch_per_gpu=batch_per_gpu, overlap=overlap,
                         intra=intra, inter=inter, compute_s=step_s)
    return (f"{params:,} parameters x {grad_bytes} B per gradient, {gpus_per_node} GPUs per node, "
            f"single-GPU step {rows[0]['compute_s']:.4g} s, overlap {overlap:g}; in-node alpha "
            f"{intra.alpha_s * 1e6:g} us, {1 / intra.beta_s_per_B / 1e9:g} GB/s; between nodes alpha "
            f"{inter.alpha_s * 1e6:g} us, {1 / inter.beta_s_per_B / 1e9:g} GB/s\n\n"
            + markdown_table(rows, SCALING_COLUMNS, SCALING_FORMATS))


def coordination_text(max_ranks: int, groups: int, link: AlphaBeta, cycle_ms: float, plot: Path | None = None) -> str:
    """`coordination_table` as markdown, the rank count where master-worker exceeds the cycle, and
    the figure's path when ``plot`` names one (the figure is written there)."""
    rows = coordination_table(max_ranks, groups, link)
    budget = cycle_ms / 1e3
    lines = [markdown_table(rows, COORDINATION_COLUMNS, COORDINATION_FORMATS),
             f"master-worker exceeds the {cycle_ms:g} ms cycle at {breakdown_rank(rows, budget)} ranks"]
    if plot:
        lines.append(f"figure: {plot_coordination(rows, plot, budget)}")
    return "\n".join(lines)


def measure_fit(sizes: list[float], ranks: list[int], repeats: int) -> dict:
    """gloo all_reduce timed here at every size and rank count, and the ring model fitted to it."""
    from models.distributed.measure import measure_allreduce

    samples = measure_allreduce(sizes, ranks, repeats)
    fit, err = fit_alpha_beta(samples)
    return {**asdict(fit), "mean_relative_error": err, "samples": samples}


def fit_line(result: dict) -> str:
    """One line of a `measure_fit` result: alpha, beta, bandwidth and the fit's error."""
    beta = result["beta_s_per_B"]
    return (f"alpha = {result['alpha_s'] * 1e6:.1f} us, beta = {beta * 1e9:.3f} ns/B "
            f"({1 / beta / 1e9 if beta else float('inf'):.2f} GB/s), fit error {result['mean_relative_error']:.1%}")
