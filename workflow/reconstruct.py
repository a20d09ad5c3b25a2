"""The `namsa reconstruct` driver: a microscope's 4D-STEM file -> the model's maps and the iCoM map,
written into a sibling of --out that replaces it as a whole."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from namsa.errors import MemoryShortage, UserError
from namsa.sample_meta import SampleMeta

from .errors import out_of_memory
from .memory import machine_memory
from .reconstruct_findings import PredictReports, findings
from .runner_io import require_directory

#: the record of a reconstruction (workflow.reconstruct_maps): what marks an --out as an earlier result
INFO_FILE = "reconstruction.json"


#: bytes of RAM per GB of --memory-gb spent on the block being read and fitted (the rest holds the
#: interpreter, torch, the model and the stitched maps)
BLOCK_SHARE = 0.5


def reconstruct(source: Any, model: str | Path, out_dir: str | Path, *,
                calibrations: Mapping[str, Any] | None = None, memory_gb: float = 2.0,
                pattern_transform: Callable[[np.ndarray, int, int], np.ndarray] | None = None,
                refine: bool | Any = False, symmetry_average: bool = True, specimen: Any = None) -> dict[str, Any]:
    """`namsa reconstruct`: a 4D-STEM scan -> the model's maps and the iCoM map in ``out_dir``.

    source: a file path, a `stage.microscope.RawScan`, or a py4DSTEM DataCube in memory.
    calibrations: energy_kv (kV), semiangle_mrad (mrad), dk_inv_A (1/Angstrom) or dk_mrad (mrad)
    per detector pixel, step_A (Angstrom per scan step); None entries are read from the file
    (stage.microscope); detector_psf_px: the camera's point spread (Gaussian sigma, detector pixels),
    deconvolved from every pattern when given (stage.microscope.point_spread); the scan is fitted to the model by models.scan_fit. Maps are [row = y,
    col = x], pixel (0, 0) at the first probe position.
    memory_gb: the RAM the run aims at; the scan is read block by block, a block at most half of
    it (at least one tile). pattern_transform(block, y0, x0): applied to every raw block
    ``data[y0:y0+h, x0:x0+w]`` before the detector is fitted (e.g. a recentring); identity if None.
    refine: True (or a `namsa.ptychography.refine.RefineSettings`) refines each tile's potential by
    single-slice ptychography started from it (`TileRefinement`), with the tile's fitted
    patterns and the calibration of the fit; reconstruction.json records each tile's data errors.
    symmetry_average: each tile's maps averaged over the square group's 8 turns (`Reconstructor.predict`,
    8 network passes); False: one pass per tile.
    specimen: a `models.scan_fit.thickness_reference.KnownSpecimen` (`known_specimen`) when the material and
    zone axis are known: the thickness is then measured against its own simulated series.
    Returns a summary: the files written, the pixel size (Angstrom), what was resampled, the findings and the
    specimen thickness in words (``thickness``: "about 160 A (133-192) by its ...", None when not estimated).

    Everything is written into a temporary sibling of ``out_dir`` that then replaces it as a whole
    (workflow.replace_out), so a kill leaves the earlier result or the new one, never a mix.
    """
    from .reconstruct_maps import is_output_name
    from .replace_out import discard, start_replacing

    if not (isinstance(memory_gb, (int, float)) and memory_gb > 0):
        raise UserError(f"--memory-gb must be a positive number of GB, got {memory_gb!r}")
    out = require_directory(out_dir, make=False)  # made by the swap: a refused run leaves no trace
    tmp = start_replacing(out, is_output_name, INFO_FILE)  # refuses an unwritable --out before any work
    try:
        return _reconstruct_into(tmp, out, source, model, calibrations or {}, memory_gb, pattern_transform, refine,
                                 symmetry_average, specimen)
    except BaseException as exc:
        discard(tmp)
        if out_of_memory(exc):  # a host or GPU shortage; reconstruct's own advice: the CLI's catch-all names simulate's and train's
            raise _out_of_memory(memory_gb) from None
        raise


def known_specimen(material: str | None, zone_axis: Any) -> Any:
    """The `KnownSpecimen` of ``--specimen`` and ``--zone-axis`` (None when neither is given), its structure
    read now; a one-line `UserError` when only one is given or the structure cannot be read."""
    if material is None and zone_axis is None:
        return None
    if material is None or zone_axis is None:
        raise UserError("--specimen and --zone-axis go together: name the material and the zone axis it was "
                        "tilted to (e.g. --specimen NiO-rocksalt --zone-axis 0,1,1), or neither")
    from models.scan_fit.thickness_reference import KnownSpecimen

    return KnownSpecimen.checked(material, zone_axis)


def _out_of_memory(memory_gb: float) -> MemoryShortage:
    """The one line of a reconstruction that ran out of memory all the same (other programs took it)."""
    available = machine_memory()[1] / 2**30
    return MemoryShortage(f"namsa reconstruct ran out of memory at --memory-gb {memory_gb:g} ({available:.3g} GB available "
                    "now); pass a smaller --memory-gb (the scan is then read in smaller blocks, down to one tile of "
                    "the model) or bin the detector's patterns; an earlier result in --out is unchanged")


def _reconstruct_into(tmp: Path, out: Path, source: Any, model: str | Path, calibrations: Mapping[str, Any],
                      memory_gb: float, transform: Any, refine: Any, symmetry_average: bool, specimen: Any
                      ) -> dict[str, Any]:
    """The work of `reconstruct`: open, check, stream tiles through the model, write, swap."""
    from models import load_reconstructor
    from models import scan_fit as fit
    from models.scan_fit.thickness import check_thickness
    from namsa.constants import mrad_per_inv_A
    from stage import microscope as ex
    from stage.microscope.autocal import block_bytes_within
    from stage.microscope.check_report import add_warning
    from stage.microscope.counts_restore import with_counts_restored

    from . import reconstruct_maps

    scan = ex.as_raw_scan(source)
    budget = int(memory_gb * 2**30 * BLOCK_SHARE)
    rec = load_reconstructor(model)
    reconstruct_maps.check_map_names(rec.targets)  # the card's targets become file names
    expect = fit.model_expectation(rec.card)
    _check_memory(scan, expect, calibrations, memory_gb)  # from the header, before the first read
    # refuses non-CBED, a wrong disc, missing calibrations and what this model cannot take, all in one
    # message; its blocks sized so that their temporaries fit the budget
    cal, checks, from_data = ex.check_before_inference(
        scan, calibrations, block_bytes_within(budget),
        model_problems=lambda known: fit.sampling_problems(scan.data.shape, known, expect))
    plan = fit.plan_fit(scan.data.shape, cal, expect)
    # tiles overlap so that no kept pixel lies within the network's edge reach of an inner tile border
    grid = fit.tile_grid(plan.shape, expect.scan_shape, expect.target_px,
                         margin=fit.tile_margin(rec.model.arch, expect.target_px))
    # the fit saw the file's own scan order; the maps' frame has the backwards-read axes mirrored
    flipped = (plan.scan[0].flipped, plan.scan[1].flipped)
    correction = from_data.descan_correction(scan.data.shape[:2], flipped) if transform is None else None
    turned = correction is not None and from_data.applied_rotation(flipped) is not None
    rotation = from_data.rotation_finding(flipped) if transform is None else None
    if rotation:   # undone, or too uncertain to undo: either way the user hears it
        add_warning(checks, *rotation)
    # a camera's values become electrons before anything else (the checks measured them so)
    transform = with_counts_restored(from_data.counts, correction or transform)
    tile_cal = _tile_calibration(plan, expect, cal.energy_kv)
    refining = TileRefinement.start(rec, plan, expect, cal, refine) if refine else None
    predicted = PredictReports()
    with warnings.catch_warnings():  # predict's OutsideTrainingWarning: gathered (predicted), printed once by the CLI
        warnings.simplefilter("ignore", fit.OutsideTrainingWarning)
        stitched, com, scales, pacbed = _stream(scan, plan, grid, rec, budget, transform, tile_cal, refining,
                                                symmetry_average, predicted)
    pixel = (plan.step_A[0] * expect.scan_shape[0] / expect.target_px,
             plan.step_A[1] * expect.scan_shape[1] / expect.target_px)
    maps = dict(zip(rec.targets, stitched))
    maps["icom_potential"] = _icom(com, plan, cal.energy_kv, stitched.shape[1:])
    notes = plan.notes + _tile_notes(plan, grid, scales)
    notes += [f"patterns recentred on the direct beam{' and turned back by the fitted scan rotation' if turned else ''}"
              " (fitted to the data: calibration_from_data)"] if correction else []
    info = _reconstruct_info(scan.path, model, cal, expect, plan, grid, scales, notes, memory_gb)
    if rec.model.arch.physics_inputs:  # what the model's CoM/iCoM input planes were computed with
        info["physics_input_calibration"] = tile_cal.to_dict()
    info["symmetry_average_turns"] = rec.last_turns   # 8: each tile's maps averaged over the turns; 1: one pass
    if refining is not None:
        info["refinement"] = refining.report()
    after = fit.check_after_inference(maps, rec.card, checks)
    # the thickness from the whole scan's PACBED, here and not in predict's input checks: its premise, a
    # thermal-diffuse tail, holds for every real specimen but not for simulations without frozen phonons,
    # where it read 40 A samples as up to 194 A (docs/experimental-data.md, "Thickness from the data")
    thickness = check_thickness(after, pacbed, rec.card, plan.dk_inv_A * mrad_per_inv_A(cal.energy_kv),
                                specimen=specimen)
    info.update(checks={"before": checks, "predict": predicted.merged(), "after": after},
                calibration_from_data=from_data.report())
    info["findings"] = findings(info["checks"])   # what bears on trust, once: the terminal, the figure, the JSON
    written = _write_and_swap(tmp, out, maps, pixel, info)
    measured = after["measured"].get("thickness_A") or {}
    return {"out": str(out), "files": written, "pixel_size_A": pixel, "shape": list(stitched.shape[1:]),
            "notes": notes, "findings": info["findings"], "warnings": [f["message"] for f in info["findings"]],
            "thickness": None if thickness is None else f"{thickness.said()} by its {measured.get('method')}"}


def _check_memory(scan: Any, expect: Any, calibrations: Mapping[str, Any], memory_gb: float) -> None:
    """Refuse a scan whose least hold at once (one tile of its patterns as stored, the checks' copies of
    one pattern: stage.microscope.memory) is over the data blocks' budget, before anything is read,
    with every problem its header already shows for this model in the same line."""
    from models import scan_fit as fit
    from stage import microscope as ex
    from stage.microscope.calibration import known_calibrations
    from stage.microscope.errors import all_problems

    problem = ex.memory_problem(scan, expect.scan_shape, (expect.pattern_px, expect.dk_range_inv_A), memory_gb,
                                BLOCK_SHARE, machine_memory()[0])
    if problem:
        known = known_calibrations(scan.found, calibrations)
        raise all_problems([problem, *fit.sampling_problems(scan.data.shape, known, expect)])


def _tile_calibration(plan: Any, expect: Any, energy_kv: float) -> Any:
    """Every tile's calibration (`namsa.icom.ScanCalibration`): the file's own detector sampling and scan
    step after the fit, and not periodic (a tile is a window inside the specimen). A model with physics
    inputs computes its planes with it; every model's input report reads the defocus at its step."""
    from namsa.icom import ScanCalibration

    return ScanCalibration(scan_shape=tuple(expect.scan_shape), k_sampling_invA=(plan.dk_inv_A, plan.dk_inv_A),
                           energy_kv=energy_kv, scan_step_A=plan.step_A, periodic=False)


def _stream(scan: Any, plan: Any, grid: Any, rec: Any, budget: int, transform: Any,
            tile_calibration: Any = None, refining: Any = None, symmetry_average: bool = True,
            predicted: PredictReports | None = None) -> tuple[np.ndarray, np.ndarray, list[float], np.ndarray]:
    """Blocks of tiles read, fitted, normalised per tile, predicted (with ``tile_calibration``: the physics
    input planes of a model that takes them, and every input report's probe step; each potential refined by ``refining``, a `TileRefinement`, when
    given) and blended; the centre of mass of every fitted pattern gathered on the way. Returns
    (C, H, W) maps, the (Y, X, 2) CoM (1/Angstrom) over the covered scan and the intensity factor
    of each tile, and the (P, P) mean of every tile's normalised patterns (the PACBED the model saw); each
    block's input report (``rec.last_report``) is added to ``predicted``."""
    from models import scan_fit as fit
    from namsa.icom import center_of_mass

    ky, kx = scan.data.shape[2:]
    per_position = ky * kx * (scan.data.dtype.itemsize + 8) + 8 * plan.pattern_px ** 2
    stitcher = fit.Stitcher(len(rec.targets), grid)
    com = np.zeros((*grid.covered, 2))
    scales: list[float] = []
    pacbed, tiled = np.zeros((plan.pattern_px, plan.pattern_px)), 0
    sy, sx = grid.scan_shape
    for block in fit.blocks(grid, per_position, budget):
        fitted = fit.read_fitted(scan.data, plan, (block.y0, block.y1), (block.x0, block.x1), transform)
        flat = fitted.reshape(-1, *fitted.shape[2:])
        com[block.y0:block.y1, block.x0:block.x1] = center_of_mass(flat, plan.dk_inv_A).reshape(*fitted.shape[:2], 2)
        tiles = []
        for oy, ox in block.origins:
            tile = fitted[:, ox - block.x0: ox - block.x0 + sx].reshape(sy * sx, *fitted.shape[2:])
            tile, scale = fit.normalise_tile(tile, f"{scan.path}: the tile at scan position (y={oy}, x={ox})")
            tiles.append(tile)
            scales.append(scale)
            pacbed += np.asarray(tile, dtype=np.float64).sum(axis=0)
            tiled += len(tile)
        options = refining.predict_options() if refining is not None else {}
        # the file's one dose figure is the one measured as read (checks.before): the fitted tiles are
        # cropped and rebinned, so their counts no longer tell it
        for origin, maps in zip(block.origins, rec.predict(np.stack(tiles), calibration=tile_calibration,
                                                           check_dose=False,
                                                           symmetry_average=None if symmetry_average else False,
                                                           **options)):
            stitcher.add(maps, origin)
        if predicted is not None:
            predicted.add(rec.last_report)
        if refining is not None:
            refining.record(block.origins, rec.last_refinement)
    return stitcher.result(), com, scales, pacbed / max(tiled, 1)


@dataclass
class TileRefinement:
    """`namsa reconstruct --refine`: what every tile's refinement shares (the settings, the meta of one
    tile: its scan, the fitted detector sampling and the physics of the file) and what each did."""

    settings: Any
    meta: SampleMeta
    tiles: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def start(cls, rec: Any, plan: Any, expect: Any, cal: Any, refine: Any) -> "TileRefinement":
        """The refinement of tiles of ``expect.scan_shape`` positions at the fitted step and detector
        sampling; ``refine``: True (default settings) or a `RefineSettings`. The thickness is unknown,
        so single-slice; the probe starts at the defocus the model's card expects (0 without one) and
        probe retrieval refines it."""
        from namsa.optics import scan_positions
        from namsa.ptychography.refine import RefineSettings

        sy, sx = expect.scan_shape
        fov = (0.0, 0.0, sy * plan.step_A[0], sx * plan.step_A[1])  # map pixel (0, 0) at the tile's first position
        positions = tuple(tuple(p) for p in scan_positions(fov, (sy, sx)).tolist())
        meta = SampleMeta(scan_shape=(sy, sx), fov_A=fov, scan_positions_A=positions, energy_kv=float(cal.energy_kv),
                          semiangle_mrad=float(cal.semiangle_mrad), pattern_dk_inv_A=float(plan.dk_inv_A),
                          aberrations=_expected_aberrations(rec.card))
        return cls(RefineSettings() if refine is True else refine, meta)

    def predict_options(self) -> dict[str, Any]:
        """`Reconstructor.predict`'s refine arguments (every tile shares one meta)."""
        return {"refine": self.settings, "refine_meta": self.meta}

    def record(self, origins: Any, results: Any) -> None:
        """Keep what the refinement of the tiles at ``origins`` (scan positions (y, x)) did."""
        for (oy, ox), result in zip(origins, results):
            facts = result.record()
            del facts["errors"]  # per-iteration history: too long for a record of every tile
            self.tiles.append({"origin_yx": [int(oy), int(ox)], **facts})

    def report(self) -> dict[str, Any]:
        """reconstruction.json's ``refinement`` section."""
        kept = sum(t["kept_network"] for t in self.tiles)
        return {"method": "single-slice ptychography (py4DSTEM) started from the network's potential; the network's "
                          "map kept where that raised the data error (namsa.ptychography.refine)",
                "probe_start_aberrations": dict(self.meta.aberrations or {}), "settings": self.settings.model_dump(),
                "tiles_kept_network": kept, "tiles": self.tiles}


def _expected_aberrations(card: Any) -> dict[str, float]:
    """The probe's start: the card's aberrations with C1 at the middle of its defocus range (0 without)."""
    if card.expects_input is None:
        return {"C1_A": 0.0, "C3_mm": 0.0}
    cfg = card.expects_input.simulation_config()   # the card read as the config it was trained with
    lo, hi = cfg.variations.defocus_range_A
    return {**cfg.aberrations.model_dump(), "C1_A": cfg.aberrations.C1_A + (lo + hi) / 2.0}


def _icom(com: np.ndarray, plan: Any, energy_kv: float, shape: tuple[int, ...]) -> np.ndarray:
    """The iCoM map (V * Angstrom) from the gathered CoM, on the grid of the model's maps."""
    from namsa.icom import icom_from_com

    return icom_from_com(com, energy_kv=energy_kv, scan_step_A=plan.step_A, output_shape=shape,
                         periodic=False).astype("float32")


def _tile_notes(plan: Any, grid: Any, scales: list[float]) -> list[str]:
    """What the tiling did: positions left out beyond the last tile, the intensity factors."""
    notes = []
    left = plan.shape[0] * plan.shape[1] - grid.covered[0] * grid.covered[1]
    if left:
        notes.append(f"{left} probe positions beyond the last whole {grid.scan_shape[0]}x{grid.scan_shape[1]} tile "
                     "were left out")
    if any(s != 1.0 for s in scales):
        totals = [1.0 / s for s in scales]
        notes.append(f"patterns divided by their mean total intensity on the model's detector, per tile "
                     f"({min(totals):.6g}-{max(totals):.6g}; the model's incident probe carries 1)")
    return notes


def _write_and_swap(tmp: Path, out: Path, maps: Mapping[str, Any], pixel: tuple[float, float],
                    info: Mapping[str, Any]) -> dict[str, str]:
    """Write the maps into ``tmp`` and swap it into the place of ``out``; a failed write (disk full,
    file too large, permission) is one line and leaves the earlier result in ``out`` as it was."""
    from .oserrors import ADVICE, OTHER_ADVICE, os_error_kind
    from .reconstruct_maps import write_maps
    from .replace_out import finish_replacing

    try:
        files = write_maps(tmp, maps, pixel, info)
        finish_replacing(tmp, out, INFO_FILE)
    except OSError as exc:   # the kind and advice of the errno: a full disk is not the only cause
        raise os_error_kind(exc)(f"writing the maps into --out {out} failed ({exc.strerror or exc}); "
                                 f"{ADVICE.get(exc.errno or -1, OTHER_ADVICE)} (an earlier result there is unchanged)") from None
    return {name: str(out / Path(p).name) for name, p in files.items()}


def _reconstruct_info(path: str, model: str | Path, cal: Any, expect: Any, plan: Any, grid: Any,
                      scales: list[float], notes: list[str], memory_gb: float) -> dict[str, Any]:
    """The JSON record of a reconstruction: inputs, calibrations and their sources, resampling, tiling."""
    units = {"energy_kv": "kV", "semiangle_mrad": "mrad", "dk_inv_A": "1/Angstrom per detector pixel",
             "step_A": "Angstrom per scan step [y, x] (negative: the axis runs against the calibrated direction)"}
    return {
        "file": str(path), "model": str(model),
        "calibrations": {name: {"value": getattr(cal, name), "unit": unit, "source": cal.sources.get(name)}
                         for name, unit in units.items()},
        "model_expects": {"energy_kv": expect.energy_kv, "semiangle_mrad": expect.semiangle_mrad,
                          "scan_shape": list(expect.scan_shape), "dk_range_inv_A": list(expect.dk_range_inv_A),
                          "scan_step_range_A": list(expect.step_range_A), "source": expect.source},
        "sampling_used": {"dk_inv_A": plan.dk_inv_A, "scan_step_A": list(plan.step_A),
                          "flipped_yx": [plan.scan[0].flipped, plan.scan[1].flipped],
                          "intensity_scale": [min(scales), max(scales)]},
        "tiling": {"tile_origins_y": list(grid.origins_y), "tile_origins_x": list(grid.origins_x),
                   "tiles": len(scales), "blending": f"weight 0 on the {grid.margin} map pixels next to each inner tile border (the network's "
                   "edge reach), raised-cosine ramps across the rest of the overlap, normalised by their sum; the "
                   f"outer {grid.margin} pixels of the whole map still see the network's padding", "margin_px": grid.margin,
                   "memory_gb": memory_gb},
        "resampling": notes or ["none: the file's sampling is the model's"],
    }
