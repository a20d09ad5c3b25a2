"""execution.simulate_deadline_s: the simulate stage starts no sample after its deadline; the samples
not reached are stopped, not failed (a rerun simulates them), each worker takes its samples in an
interleaved order so a cut set spans the materials, and `namsa run` trains on what exists."""
from __future__ import annotations

import json
from pathlib import Path

from namsa import SampleSpec
from workflow.cli import main
from workflow.data_runners import interleaved, stored_ids, worker_share

MICRO = str(Path(__file__).resolve().parents[1] / "configs" / "micro.yaml")


def test_interleaved_spans_the_templates_first_and_keeps_each_ones_order():
    specs = [SampleSpec(m, (0, 0, 1), v) for m in ("Si-diamond", "NaCl-rocksalt", "NaCl-rocksalt:K,Br:1.0731",
                                                     "NaCl-rocksalt:Li,F:0.8000") for v in (0, 1)]
    order = [(s.material_id, s.variant) for s in interleaved(specs)]
    assert sorted(order) == sorted((s.material_id, s.variant) for s in specs)
    assert {m for m, _ in order[:2]} == {"Si-diamond", "NaCl-rocksalt"}   # one of each template first
    nacl = [x for x in order if x[0].startswith("NaCl-rocksalt")]
    assert nacl == [(s.material_id, s.variant) for s in specs if s.material_id.startswith("NaCl-rocksalt")]


def test_workers_stopped_early_together_span_as_many_templates_as_samples():
    specs = [SampleSpec(f"M{m}", (0, 0, 1), v) for m in range(8) for v in range(4)]   # 8 structure types
    shares = [worker_share(specs, w, 2) for w in range(2)]
    assert sorted(map(str, (s for share in shares for s in share))) == sorted(map(str, specs))   # every spec, once
    # each worker takes its share in interleaved order (simulate_specs); two samples each before the deadline
    first = [s.material_id for share in shares for s in interleaved(share)[:2]]
    assert len(set(first)) == 4, first


def test_a_deadline_stops_simulate_without_failures_and_a_rerun_finishes(tmp_path, capsys):
    out = tmp_path / "data"
    assert main(["simulate", MICRO, "--out", str(out), "--no-progress",
                 "--set", "execution.simulate_deadline_s=1e-9"]) == 0
    captured = capsys.readouterr()
    assert "stopped at the deadline" in captured.out
    assert "execution.simulate_deadline_s reached: 8 planned samples not simulated" in captured.err
    summary = json.loads((out / "simulate-000.json").read_text())
    assert summary["deadline_reached"] and summary["failed"] == [] and summary["written"] == 0
    assert main(["simulate", MICRO, "--out", str(out), "--no-progress"]) == 0
    assert len(stored_ids(out)) == 8


def test_run_trains_on_what_exists_when_the_deadline_stops_the_rest(tmp_path, capsys):
    run = tmp_path / "run"
    # half the plan exists (worker 0 of 2), then a run whose deadline has passed before its first sample
    assert main(["simulate", MICRO, "--out", str(run / "data"), "--no-progress", "--worker", "0", "--of", "2"]) == 0
    have = len(stored_ids(run / "data"))
    assert 0 < have < 8
    code = main(["run", MICRO, "--out", str(run), "--no-progress", "--set", "execution.simulate_deadline_s=1e-9",
                 "--set", "execution.min_success_fraction=1.0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"{8 - have} not reached by the simulate deadline" in out
    assert json.loads((run / "summary.json").read_text())["not_reached"] == 8 - have
    assert (run / "model" / "model_card.json").exists()


def test_keys_added_later_leave_a_finished_runs_stage_hashes_alone_at_their_defaults():
    """training.max_wall_s, training.init_from and data.dose_augmentation.on_device (issue 28), data.resident
    and simulation.first_variant (issue 41), data.camera_augmentation (issue 42) and the study's data mix
    (issue 30: generator.light_fraction / light_family_weights, variations.thin_fraction / thin_below_A)
    came after runs were made: at their defaults the quickstart's stage hashes are the ones of the
    commit before them (0958660) but for model.padding_mode, whose scan-preset default changed the
    model (zeros -> circular): the quickstart retrains once; set, the other keys count."""
    from workflow import model_runners
    from workflow.config import load_config

    quickstart = str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
    cfg = load_config(quickstart, [])
    assert model_runners.section_hash(cfg, *model_runners.TRAIN_SECTIONS) == \
        "812b2f6d33163868e851e11e05cbb3e8fdc71ddd625e982855fbbb9fb5987681"
    ranged = ["simulation.variations.thickness_range_A=[10, 150]"]
    for base, later in (([], ["simulation.generator.light_fraction=0.5", "simulation.generator.substitution=oxidation"]),
                        (ranged, ranged + ["simulation.first_variant=1"]),
                        (ranged, ranged + ["simulation.variations.thin_fraction=0.3",
                                           "simulation.variations.thin_below_A=50"])):
        before, after = load_config(quickstart, base), load_config(quickstart, later)
        assert model_runners.section_hash(after, *model_runners.TRAIN_SECTIONS) != \
            model_runners.section_hash(before, *model_runners.TRAIN_SECTIONS), later
    for later in ("training.max_wall_s=60", "training.init_from=pretrained:study-scan-gpu", "data.resident=true",
                  "data.camera_augmentation.seed=1"):
        changed = load_config(quickstart, [later])
        assert model_runners.section_hash(changed, *model_runners.TRAIN_SECTIONS) != \
            model_runners.section_hash(cfg, *model_runners.TRAIN_SECTIONS), later
