"""Sample ids: made by namsa.sample.sample_id, read back by parse_sample_id (what a re-simulation needs)."""
from __future__ import annotations

import pytest

from namsa.sample import parse_sample_id, sample_id


@pytest.mark.parametrize("material", ["Al-fcc", "A2B5_mC28_15_f_e2f:Pr,Cd:1.4556", "odd__name"])
def test_an_id_reads_back_as_what_made_it(material):
    sid = sample_id(material, (2, -1, 0), 3, "f" * 64)
    assert parse_sample_id(sid) == (material, (2, -1, 0), 3)


@pytest.mark.parametrize("bad", ["Al-fcc", "Al-fcc__0_1__v0__abc", "Al-fcc__0_1_1__x0__abc", "__0_1_1__v0__abc"])
def test_what_is_not_an_id_is_refused(bad):
    with pytest.raises(ValueError, match="is not a sample id"):
        parse_sample_id(bad)
