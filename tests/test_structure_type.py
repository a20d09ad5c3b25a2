"""namsa.structure_type: one label per structure type, whichever way a material entered the plan."""
from __future__ import annotations

from pymatgen.core import Lattice, Structure

from namsa import generator, library
from namsa.structure_type import LIBRARY_AFLOW, prototype_label


def test_library_tags_and_generated_templates_share_one_label():
    tags = {library.info(i)["prototype"] for i in library.list_ids()}
    assert tags == set(LIBRARY_AFLOW)                      # every library tag has its AFLOW label
    assert prototype_label("NaCl-rocksalt") == prototype_label("MgO-rocksalt") == "AB_cF8_225_a_b"
    # a substitution keeps the type, whichever rocksalt template it came from
    assert prototype_label("MgO-rocksalt:K,Br:1.0731") == prototype_label("NaCl-rocksalt")
    for material_id in generator.generated_ids(generator.GeneratorConfig(count=50, seed=2)):
        template = material_id.split(":")[0]
        assert prototype_label(material_id) == prototype_label(template)
    assert prototype_label("aflow-X:Fe:1.0000") == "aflow-X"   # a non-library template is its own type


def test_structures_outside_the_library_get_the_aflow_matcher_label():
    rocksalt = Structure.from_spacegroup("Fm-3m", Lattice.cubic(4.2), ["Mg", "O"], [[0, 0, 0], [0.5, 0.5, 0.5]])
    # a CIF of a library type joins that type: its label is the library's
    assert prototype_label("my-periclase", rocksalt) == prototype_label("MgO-rocksalt")
    odd = Structure(Lattice.from_parameters(3.1, 4.7, 5.9, 81, 97, 112), ["Fe", "Se", "Te"],
                    [[0, 0, 0], [0.31, 0.17, 0.58], [0.73, 0.61, 0.21]])
    assert prototype_label("odd-triclinic", odd) == "odd-triclinic"   # no AFLOW match: its own type
    assert prototype_label("some-cif-stem") == "some-cif-stem"        # no structure at hand


def test_a_cif_is_labelled_only_when_a_split_by_structure_type_asks(tmp_path):
    """The first simulation of a CIF imports no AFLOW prototype data (3-9 s); the label is matched
    when a split by prototype asks, on the structure the simulator remembered, and equals the
    matcher's label of that structure (a CIF of a library type joins that type)."""
    import subprocess
    import sys

    script = f"""
import sys
from pymatgen.core import Lattice, Structure
from namsa import SimulationConfig, simulate_sample
from stage.splits import sample_split, split_key
cif = {str(tmp_path / "my-periclase.cif")!r}
Structure.from_spacegroup("Fm-3m", Lattice.cubic(4.2), ["Mg", "O"], [[0, 0, 0], [0.5, 0.5, 0.5]]).to(filename=cif)
cfg = SimulationConfig(scan_shape=(2, 2), pattern_px=8, target_px=8, cell_lateral_A=8.0, thickness_A=4.0, sampling_A=0.25)
meta = simulate_sample(cif, (0, 0, 1), cfg).meta
print(meta.prototype, "pymatgen.analysis.prototypes._data" in sys.modules)
print(split_key(meta, "material"), "pymatgen.analysis.prototypes._data" in sys.modules)
print(split_key(meta, "prototype"), "pymatgen.analysis.prototypes._data" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split() for line in done.stdout.strip().splitlines()]
    assert lines[0] == ["None", "False"]                 # simulated: no label, no AFLOW data
    assert lines[1] == ["my-periclase", "False"]         # a split by material needs none either
    assert lines[2] == [prototype_label("MgO-rocksalt"), "True"]   # asked: matched, a library type's label
