"""Measure a shipped model's error-vs-dose curve on a small dev store and record it on its card.

    .venv/bin/python scripts/card_dose_curve.py study-scan-gpu study-scan --work runs/dose-curve

(about 25 minutes on a busy 2-core CPU, most of it the network's 8 passes per sample and dose;
``--no-write`` measures and prints without touching the cards). For each named model in
models/pretrained/: its card's simulation config (``card.simulation_config``, the physics it was
trained at) is planned (`namsa.plan_samples`), and of the plan one sample per material, spread over
the structure types (`workflow.data_runners.interleaved`), is simulated on the CPU: ``--dev`` samples
of the dev split and ``--train`` of the training split (only their targets are read: the mean image,
`evaluation.baselines.mean`, averages them), stored as the card's data config stores them, so the
splits are the ones the model was trained with. `evaluation.evaluate` then scores the dev split,
noise-free and at each ``--doses`` (e/Angstrom^2, `evaluation.dose_sweep`: the network with its maps
averaged over the 8 turns as `namsa reconstruct` makes them, the mean image and iCoM on the same
Poisson-noised patterns), and the field's-rule relative L2 of each (mean, bootstrap interval over
materials, median) becomes the card's ``dose_response`` (`models.card_dose.DoseResponse`), with the
constant map's (the truth's mean everywhere) on the same samples. An evaluation already in ``--work``
at the same doses is read again, not redone (like the store, the work folder resumes). Only that
field is added to ``model_card.json``: every other field stays as it was (checked after writing),
and the weights are not touched (their digest is checked by loading the model).
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import stage  # noqa: E402
from evaluation import EvaluationConfig, evaluate  # noqa: E402
from evaluation.metrics import bootstrap_ci, relative_l2  # noqa: E402
from models import load_reconstructor  # noqa: E402
from models.card import CARD_FILE, ModelCard, validate_card  # noqa: E402
from models.card_dose import DoseResponse  # noqa: E402
from models.card_writer import write_card  # noqa: E402
from models.pretrained_index import PRETRAINED_DIR  # noqa: E402
from namsa.plan import SampleSpec, plan_samples  # noqa: E402
from namsa.structure_type import prototype_label  # noqa: E402
from stage.splits import split_of  # noqa: E402
from workflow.data_runners import interleaved, simulate_specs  # noqa: E402

DOSES = [10.0, 30.0, 100.0, 300.0, 1e3, 1e4, 1e5]
METHODS = {"network": "network", "mean": "mean_image", "icom": "icom"}   # metrics.json key -> record field


def split_specs(card: ModelCard, specs: list[SampleSpec], split: str, n: int) -> list[SampleSpec]:
    """The first ``n`` materials of ``split`` in the plan (one zone axis each, interleaved over structure
    types), split as the card's data config splits (by material or structure type, its fractions and seed)."""
    data = card.data_config
    by_material: dict[str, SampleSpec] = {}
    for spec in specs:
        key = spec.material_id if data.split_by == "material" else prototype_label(spec.material_id)
        if split_of(key, data.split_fractions, data.split_seed) == split:
            by_material.setdefault(spec.material_id, spec)
    return interleaved(list(by_material.values()))[:n]


def simulate_store(card: ModelCard, data_dir: Path, n_dev: int, n_train: int) -> list[SampleSpec]:
    """Simulate ``n_dev`` dev and ``n_train`` training samples of the card's plan into ``data_dir``
    (resumable: samples already stored are skipped); returns the dev specs."""
    cfg = card.simulation_config
    started = time.time()
    plan = plan_samples(cfg)
    print(f"  planned {len(plan.specs)} samples in {time.time() - started:.0f} s", flush=True)
    dev, train = split_specs(card, plan.specs, "dev", n_dev), split_specs(card, plan.specs, "train", n_train)
    # the card's own training materials, where it lists them: no dev sample may share a structure type with one
    listed = (card.trained_on.data.materials if card.trained_on and card.trained_on.data else {}).get("train", [])
    seen = {prototype_label(m) for m in listed} | set(listed)
    leaked = [s.material_id for s in dev if s.material_id in seen or prototype_label(s.material_id) in seen]
    if leaked:
        raise SystemExit(f"dev materials {leaked[:3]} share a structure type with the card's training materials: "
                         f"the split differs from the one the model was trained with")
    summary = simulate_specs(cfg, card.data_config, data_dir / "store-000", dev + train, plan.sources, progress=False)
    print(f"  {summary.line()}", flush=True)
    return dev


def measure(name: str, card: ModelCard, data_dir: Path, out: Path, doses: list[float]) -> dict[str, Any]:
    """`evaluation.evaluate` of ``pretrained:name`` on the dev split of ``data_dir`` at ``doses``: metrics.json
    (one already in ``out`` for these doses is read, not made again)."""
    done = out / "metrics.json"
    if done.exists() and json.loads(done.read_text())["config"]["doses"] == doses:
        print(f"  reading the evaluation in {done}", flush=True)
        return json.loads(done.read_text())
    cfg = EvaluationConfig(split="dev", doses=doses, n_panels=0, worst_k=0, n_bootstrap=1000, symmetry_average=True)
    result = evaluate(cfg, card.data_config, [data_dir], f"pretrained:{name}", out)
    return json.loads(result.metrics_json.read_text())


def constant_map(data_dir: Path, targets: list[str], ci_level: float) -> dict[str, Any]:
    """The constant map's relative L2 (the truth's mean in every pixel: the field's rule applied to a map
    that reads nothing) per target over the dev split, with the evaluation's interval over materials."""
    errors: dict[str, list[float]] = {t: [] for t in targets}
    materials = []
    with stage.open_stores([data_dir]) as stores:
        for i in stores.indices("dev"):
            reader, j = stores.locate(i)
            arrays, meta = reader.read_arrays(j, names=tuple(targets))
            materials.append(meta.material_id)
            for t in targets:
                truth = arrays[t].astype(np.float64)
                errors[t].append(relative_l2(np.full_like(truth, truth.mean()), truth))
    out = {}
    for t, values in errors.items():
        ci = bootstrap_ci(values, n_resamples=1000, level=ci_level, groups=materials)
        out[t] = {"mean": ci.value, "low": ci.low, "high": ci.high, "median": float(np.median(values))}
    return out


def _stat(aggregate: dict[str, Any]) -> dict[str, float]:
    rel_l2 = aggregate["field"]["rel_l2"]
    return {"mean": rel_l2["value"], "low": rel_l2["low"], "high": rel_l2["high"], "median": rel_l2["median"]}


def dose_response(metrics: dict[str, Any], targets: list[str], constant: dict[str, Any], command: str) -> DoseResponse:
    """The card record of metrics.json's ``dose_sweep`` (each method's field-rule relative L2 per dose)."""
    points = []
    for entry in metrics["dose_sweep"]:
        point: dict[str, Any] = {"dose_e_per_A2": entry["dose_e_per_A2"]}
        for target in targets:
            found = entry["aggregates"][target]
            point[target] = {field: _stat(found[key]) for key, field in METHODS.items() if key in found}
        points.append(point)
    network = metrics["aggregates"]["potential"]["network"]["field"]["rel_l2"]
    return DoseResponse.model_validate({
        "view": "field", "metric": "rel_l2", "split": metrics["config"]["split"],
        "n_samples": network["n"], "n_materials": network["n_groups"],
        "mean_image_samples": metrics["data"]["counts"].get("train", 0),
        "symmetry_average": metrics["config"]["symmetry_average"], "ci_level": metrics["config"]["ci_level"],
        "command": command, "measured": time.strftime("%Y-%m-%d"), "constant_map": constant, "points": points})


def write_record(folder: Path, record: DoseResponse) -> None:
    """Add ``record`` as the card's ``dose_response``; every other field is checked unchanged after writing,
    and the weights' digest by loading the model."""
    path = folder / CARD_FILE
    text = path.read_text()
    before = json.loads(text)
    card = validate_card({**before, "dose_response": record.model_dump(mode="json")}, str(path))
    write_card(folder, card)
    if text.endswith("\n"):   # a card saved by an editor ends with a newline: its last byte kept too
        path.write_text(path.read_text() + "\n")
    after = json.loads(path.read_text())
    assert {k: v for k, v in after.items() if k != "dose_response"} == {k: v for k, v in before.items()
                                                                      if k != "dose_response"}, path
    load_reconstructor(folder, device="cpu")


def table(name: str, record: DoseResponse, noise_free: dict[str, Any]) -> str:
    """The curve as a markdown table (potential; density in its own columns when recorded)."""
    def cell(stat: Any) -> str:
        return "-" if stat is None else f"{stat.mean:.3f} [{stat.low:.3f}, {stat.high:.3f}]"

    lines = [f"**pretrained:{name}** ({record.split} split, {record.n_samples} samples of {record.n_materials} "
             f"materials; mean image of {record.mean_image_samples} training samples; rel. L2, field's rule, "
             f"mean [{record.ci_level:.0%} interval over materials])", "",
             "| dose (e/A^2) | network | mean image | iCoM | network, density | mean image, density | unusable |",
             "|---|---|---|---|---|---|---|"]
    for p in record.points:
        d = p.density
        lines.append(f"| {p.dose_e_per_A2:g} | {cell(p.potential.network)} | {cell(p.potential.mean_image)} | "
                     f"{cell(p.potential.icom)} | {cell(d.network if d else None)} | "
                     f"{cell(d.mean_image if d else None)} | {'yes' if record.unusable(p.dose_e_per_A2) else 'no'} |")
    const = record.constant_map
    lines.append(f"| any (constant map) | | {cell(const.potential)} | | | "
                 f"{cell(const.density)} | |")
    free = {m: noise_free["potential"][m]["field"]["rel_l2"]["value"] for m in METHODS if m in noise_free["potential"]}
    lines.append(f"| noise-free | {free['network']:.3f} | {free.get('mean', float('nan')):.3f} | "
                 f"{free.get('icom', float('nan')):.3f} | | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="+", help="shipped models (models/pretrained/NAME)")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "dose-curve", help="stores and evaluations")
    parser.add_argument("--dev", type=int, default=32, help="dev samples (one per material)")
    parser.add_argument("--train", type=int, default=32, help="training samples the mean image averages")
    parser.add_argument("--doses", type=float, nargs="+", default=DOSES, help="e/Angstrom^2, ascending")
    parser.add_argument("--no-write", action="store_true", help="measure and print; leave the cards as they are")
    args = parser.parse_args(argv)
    command = "python scripts/card_dose_curve.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    for name in args.names:
        folder = REPO / "models" / PRETRAINED_DIR / name
        raw = json.loads((folder / CARD_FILE).read_text())
        raw.pop("dose_response", None)   # measured again here, and replaced
        card = validate_card(raw, name)
        print(f"{name}:", flush=True)
        simulate_store(card, args.work / name / "data", args.dev, args.train)
        metrics = measure(name, card, args.work / name / "data", args.work / name / "eval", args.doses)
        constant = constant_map(args.work / name / "data", list(card.targets), metrics["config"]["ci_level"])
        record = dose_response(metrics, list(card.targets), constant, command)
        text = table(name, record, metrics["aggregates"])
        (args.work / name / "dose_curve.md").write_text(text + "\n")
        print(text, flush=True)
        if not args.no_write:
            write_record(folder, record)
            print(f"  recorded in {folder / CARD_FILE}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
