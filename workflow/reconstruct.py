"""The `namsa reconstruct` driver: a microscope's 4D-STEM file -> the model's maps and the iCoM map,
written into a sibling of --out that replaces it as a whole."""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Mapping

from namsa.errors import UserError

from .runner_io import require_directory


def reconstruct(path: str | Path, model: str | Path, out_dir: str | Path, *,
                calibrations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`namsa reconstruct`: a 4D-STEM file -> the model's maps and the iCoM map in ``out_dir``.

    calibrations: energy_kv (kV), semiangle_mrad (mrad), dk_inv_A (1/Angstrom) or dk_mrad (mrad)
    per detector pixel, step_A (Angstrom per scan step); None entries are read from the file
    (stage.microscope). Maps are [row = y, col = x], pixel (0, 0) at the first probe position.
    Returns a summary: the files written, the pixel size (Angstrom) and what was resampled.

    Everything is written into a temporary sibling of ``out_dir`` that then replaces it as a whole
    (workflow.replace_out), so a kill leaves the earlier result or the new one, never a mix.
    """
    from .reconstruct_maps import is_output_name
    from .replace_out import discard, start_replacing

    out = require_directory(out_dir, make=False)  # made by the swap: a refused run leaves no trace
    tmp = start_replacing(out, is_output_name)  # refuses an unwritable --out before any work
    try:
        return _reconstruct_into(tmp, out, path, model, calibrations or {})
    except BaseException:
        discard(tmp)
        raise


def _reconstruct_into(tmp: Path, out: Path, path: str | Path, model: str | Path,
                      calibrations: Mapping[str, Any]) -> dict[str, Any]:
    """The work of `reconstruct`: read, check, predict, write into ``tmp``, swap it into ``out``."""
    from evaluation.baselines import icom_reconstruct
    from models import load_reconstructor
    from stage import microscope as ex

    from . import reconstruct_maps

    scan = ex.read_scan(path)
    cal, checks, from_data = ex.check_before_inference(scan, calibrations)  # refuses non-CBED, a wrong disc
    rec = load_reconstructor(model)
    reconstruct_maps.check_map_names(rec.targets)  # the card's targets become file names
    expect = ex.model_expectation(rec.card)
    prepared = ex.fit_to_model(scan, cal, expect)
    with warnings.catch_warnings():  # predict's OutsideTrainingWarning: recorded in the JSON (checks.predict)
        warnings.simplefilter("ignore", ex.OutsideTrainingWarning)
        stitched = ex.stitch(rec.predict(prepared.cbed), prepared.tiles)
    (ty, tx), (sy, sx) = prepared.tiles, prepared.scan_shape
    t_y, t_x = stitched.shape[1] // ty, stitched.shape[2] // tx
    pixel = (sy * prepared.step_A[0] / t_y, sx * prepared.step_A[1] / t_x)
    maps = dict(zip(rec.targets, stitched))
    maps["icom_potential"] = icom_reconstruct(
        ex.scan_block(prepared), (ty * sy, tx * sx), k_sampling_invA=prepared.dk_inv_A, energy_kv=cal.energy_kv,
        scan_step_A=prepared.step_A, output_shape=stitched.shape[1:], periodic=False).astype("float32")
    info = _reconstruct_info(path, model, cal, expect, prepared)
    after = ex.check_after_inference(maps, rec.card, checks)
    info.update(checks={"before": checks, "predict": rec.last_report, "after": after},
                calibration_from_data=from_data.report())
    written = _write_and_swap(tmp, out, maps, pixel, info)
    return {"out": str(out), "files": written, "pixel_size_A": pixel, "shape": list(stitched.shape[1:]),
            "notes": prepared.notes, "warnings": [w["message"] for w in checks["warnings"] + after["warnings"]]}


def _write_and_swap(tmp: Path, out: Path, maps: Mapping[str, Any], pixel: tuple[float, float],
                    info: Mapping[str, Any]) -> dict[str, str]:
    """Write the maps into ``tmp`` and swap it into the place of ``out``; a failed write (disk full,
    file too large, permission) is one line and leaves the earlier result in ``out`` as it was."""
    from .reconstruct_maps import write_maps
    from .replace_out import finish_replacing

    try:
        files = write_maps(tmp, maps, pixel, info)
        finish_replacing(tmp, out)
    except OSError as exc:
        raise UserError(f"writing the maps into --out {out} failed ({exc.strerror or exc}); free some space or "
                        "choose another --out (an earlier result there is unchanged)") from None
    return {name: str(out / Path(p).name) for name, p in files.items()}


def _reconstruct_info(path: str | Path, model: str | Path, cal: Any, expect: Any, prepared: Any) -> dict[str, Any]:
    """The JSON record of a reconstruction: inputs, calibrations and their sources, resampling."""
    units = {"energy_kv": "kV", "semiangle_mrad": "mrad", "dk_inv_A": "1/Angstrom per detector pixel",
             "step_A": "Angstrom per scan step [y, x]"}
    return {
        "file": str(path), "model": str(model),
        "calibrations": {name: {"value": getattr(cal, name), "unit": unit, "source": cal.sources.get(name)}
                         for name, unit in units.items()},
        "model_expects": {"energy_kv": expect.energy_kv, "semiangle_mrad": expect.semiangle_mrad,
                          "scan_shape": list(expect.scan_shape), "dk_range_inv_A": list(expect.dk_range_inv_A),
                          "scan_step_range_A": list(expect.step_range_A), "source": expect.source},
        "sampling_used": {"dk_inv_A": prepared.dk_inv_A, "scan_step_A": list(prepared.step_A),
                          "tiles": list(prepared.tiles), "intensity_scale": prepared.intensity_scale},
        "resampling": prepared.notes or ["none: the file's sampling is the model's"],
    }
