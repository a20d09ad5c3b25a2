"""Writes tests/data/hyperspy-written.zspy, the .zspy folder tests/test_microscope_formats.py reads.

It must be written by rosettasciio's own zspy writer, which needs zarr 2, while this project's
environment has zarr 3 (abTEM needs it), so it is made once in a separate environment:

    python3 -m venv /tmp/zvenv
    /tmp/zvenv/bin/pip install "zarr<3" "rosettasciio[zspy]==0.15.0" h5py dask numpy
    /tmp/zvenv/bin/python tests/data/make_zspy_fixture.py

A 4 x 5 scan of 8 x 8 px patterns (seeded random counts), a negative y scale (a flipped axis), beam
energy 200 kV and semi-angle 20 mrad in the metadata; the same array is saved beside it as .npy.
"""
from pathlib import Path

import numpy as np
from rsciio.zspy import file_writer

HERE = Path(__file__).resolve().parent
data = (np.random.default_rng(0).random((4, 5, 8, 8)) * 100).astype(np.float32)
axes = [{"name": n, "size": size, "scale": scale, "offset": 0.0, "units": unit, "navigate": i < 2, "index_in_array": i}
        for i, (n, size, scale, unit) in enumerate([("y", 4, -0.5, "Å"), ("x", 5, 0.5, "Å"), ("ky", 8, 0.2, "1/Å"),
                                                     ("kx", 8, 0.2, "1/Å")])]
file_writer(str(HERE / "hyperspy-written.zspy"),
            {"data": data, "axes": axes, "original_metadata": {}, "tmp_parameters": {}, "attributes": {"_lazy": False},
             "metadata": {"General": {"title": "t"}, "Signal": {"signal_type": ""},
                          "Acquisition_instrument": {"TEM": {"beam_energy": 200.0, "convergence_angle": 20.0}}},
             "learning_results": {}, "models": {}, "package_info": {"name": "namsa-tests", "version": "0"}})
np.save(HERE / "hyperspy-written.npy", data)
