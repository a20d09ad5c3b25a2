"""Writing the maps of `namsa reconstruct`: .npy and .tif per map, all maps as one calibrated HyperSpy
signal (reconstruction.hspy, which hyperspy.api.load opens), one figure,
reconstruction.json."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from stage.microscope import ExperimentalInputError

#: map name -> unit of its values
MAP_UNITS: dict[str, str] = {"potential": "V*Angstrom", "density": "electrons/Angstrom^2",
                             "icom_potential": "V*Angstrom (mean undetermined, set to 0)"}


#: the maps as py4DSTEM writes them (written when py4DSTEM is installed)
PY4DSTEM_FILE = "reconstruction_py4dstem.h5"


def is_output_name(name: str) -> bool:
    """Whether ``name`` is a file `write_maps` writes (what an earlier reconstruction may have left)."""
    stem, _, ext = name.rpartition(".")
    return (name in ("reconstruction.png", "reconstruction.json", "reconstruction.hspy", PY4DSTEM_FILE)
            or (stem in MAP_UNITS and ext in ("npy", "tif")))


def check_map_names(names: Sequence[str]) -> None:
    """Only the known map names (`MAP_UNITS`) become file names: a model card's ``targets`` decide
    them, and a name like ``../../x`` or ``/etc/x`` must not place a file outside ``--out``."""
    unknown = [name for name in names if name not in MAP_UNITS]
    if unknown:
        raise ExperimentalInputError(f"the model names an output {unknown[0]!r}, which is not one of the maps namsa "
                                     f"writes ({', '.join(MAP_UNITS)}); its card is damaged or not from namsa: "
                                     "use a model directory written by `namsa train` or a pretrained:NAME")


def write_maps(out_dir: str | Path, maps: Mapping[str, np.ndarray], pixel_A: tuple[float, float],
               info: Mapping[str, Any]) -> dict[str, str]:
    """Write each (H, W) map ([row = y, col = x]) as ``<name>.npy`` and ``<name>.tif`` (float32),
    one figure ``reconstruction.png`` and ``reconstruction.json`` (units, pixel size in Angstrom,
    ``info``). Returns name -> path of everything written. Names outside `MAP_UNITS` are refused
    before anything is written."""
    check_map_names(list(maps))
    try:
        import tifffile
    except ImportError:
        raise ExperimentalInputError("writing the maps as TIFF needs tifffile: pip install -e '.[io]'") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    for name, image in maps.items():
        image = np.asarray(image, dtype=np.float32)
        np.save(out / f"{name}.npy", image)
        tifffile.imwrite(out / f"{name}.tif", image, metadata={"unit": MAP_UNITS[name], "axes": "YX"},
                         resolution=(1.0 / pixel_A[1], 1.0 / pixel_A[0]))
        written[f"{name}.npy"], written[f"{name}.tif"] = str(out / f"{name}.npy"), str(out / f"{name}.tif")
    written["reconstruction.hspy"] = str(_hspy(out / "reconstruction.hspy", maps, pixel_A))
    written["reconstruction.png"] = str(_figure(out / "reconstruction.png", maps, pixel_A, info.get("findings", [])))
    py4dstem_note = _py4dstem(out / PY4DSTEM_FILE, maps, pixel_A)
    if (out / PY4DSTEM_FILE).is_file():
        written[PY4DSTEM_FILE] = str(out / PY4DSTEM_FILE)
    summary = {"maps": {name: {"unit": MAP_UNITS[name], "shape": list(np.shape(m)), "npy": f"{name}.npy",
                               "tif": f"{name}.tif"} for name, m in maps.items()},
               "pixel_size_A": list(pixel_A), "axes": "[row = y, col = x]", "py4dstem_file": py4dstem_note, **info}
    (out / "reconstruction.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    written["reconstruction.json"] = str(out / "reconstruction.json")
    return written


def _hspy(path: Path, maps: Mapping[str, np.ndarray], pixel_A: tuple[float, float]) -> Path:
    """All maps as one HyperSpy signal (map, y, x): a navigation axis over the map names, signal axes
    in Angstrom; each map's unit in the metadata (``Signal.map_units``), written by rosettasciio."""
    from rsciio.hspy import file_writer

    names = list(maps)
    data = np.stack([np.asarray(maps[n], dtype=np.float32) for n in names])
    axes = [{"name": "map", "size": len(names), "scale": 1.0, "offset": 0.0, "units": "", "navigate": True,
             "index_in_array": 0},
            {"name": "y", "size": data.shape[1], "scale": pixel_A[0], "offset": 0.0, "units": "Å",
             "navigate": False, "index_in_array": 1},
            {"name": "x", "size": data.shape[2], "scale": pixel_A[1], "offset": 0.0, "units": "Å",
             "navigate": False, "index_in_array": 2}]
    signal = {"data": data, "axes": axes, "original_metadata": {},
              "metadata": {"General": {"title": "namsa reconstruct: " + ", ".join(names)},
                           "Signal": {"signal_type": "", "quantity": "; ".join(f"{n}: {MAP_UNITS[n]}" for n in names),
                                      "map_names": names, "map_units": [MAP_UNITS[n] for n in names]}},
              "attributes": {"_lazy": False}, "tmp_parameters": {}, "learning_results": {}, "models": {},
              "package_info": {"name": "namsa", "version": "reconstruct"}}
    file_writer(str(path), signal)
    return path


def _py4dstem(path: Path, maps: Mapping[str, np.ndarray], pixel_A: tuple[float, float]) -> str:
    """All maps as one py4DSTEM RealSlice (y, x, map) with the real-space pixel size in Angstrom,
    saved by py4DSTEM itself (``py4DSTEM.read`` opens it), when py4DSTEM is installed; returns what
    was done, for reconstruction.json. py4DSTEM keeps one pixel size: y's, and the note says when
    x's differs."""
    try:
        import py4DSTEM
    except ImportError:
        return "not written: py4DSTEM is not installed (pip install -e '.[baselines]')"
    names = list(maps)
    data = np.stack([np.asarray(maps[n], dtype=np.float32) for n in names], axis=-1)
    image = py4DSTEM.RealSlice(data=data, name="namsa_reconstruction", units="; ".join(MAP_UNITS[n] for n in names),
                               slicelabels=names)
    image.calibration.set_R_pixel_size(float(pixel_A[0]))
    image.calibration.set_R_pixel_units("A")
    py4DSTEM.save(str(path), image)
    note = f"{path.name}: py4DSTEM RealSlice (y, x, map), maps {names}, R pixel {pixel_A[0]:.6g} A"
    if not np.isclose(pixel_A[0], pixel_A[1], rtol=1e-6):
        note += f" (y's; x's pixel is {pixel_A[1]:.6g} A, which py4DSTEM cannot hold beside it)"
    return note


def _figure(path: Path, maps: Mapping[str, np.ndarray], pixel_A: tuple[float, float],
            found: Sequence[Mapping[str, str]] = ()) -> Path:
    """One panel per map, axes in Angstrom, a colour bar with the map's unit; below them every finding
    of the reconstruction (workflow.reconstruct_findings), wrapped, or a line saying there is none."""
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = 4.2 * len(maps)
    lines = [textwrap.fill(f"warning: {f['message']}", width=int(width * 16), subsequent_indent="    ")
             for f in found] or ["no findings: the checks found the file within what the model was trained on"]
    text_rows = sum(line.count("\n") + 1 for line in lines)
    fig, axes = plt.subplots(1, len(maps), figsize=(width, 3.8 + 0.17 * text_rows), squeeze=False)
    for ax, (name, image) in zip(axes[0], maps.items()):
        h, w = np.shape(image)
        shown = ax.imshow(image, cmap="magma", extent=(0, w * pixel_A[1], h * pixel_A[0], 0))
        ax.set_title(name)
        ax.set_xlabel("x (Angstrom)")
        ax.set_ylabel("y (Angstrom)")
        fig.colorbar(shown, ax=ax, label=MAP_UNITS[name].split(" (")[0])
    fig.tight_layout(rect=(0, 0.17 * text_rows / fig.get_figheight(), 1, 1))
    fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom", ha="left", color="firebrick" if found else "black")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
