"""The one line of the low-dose warning (code "dose", `card_checks._check_dose`): the scan's measured dose
beside the doses the model was trained at and, when the card records its error-vs-dose curve
(``dose_response``, `models.card_dose.DoseResponse`), the error the card measured at that dose for the
network, the constant map and the mean image (the last two ignore the data), and "unusable" where the
curve's rule says so (`models.card_dose`). Doses in electrons/Angstrom^2; errors are relative L2 under
the field's rule (dimensionless)."""
from __future__ import annotations

from ..card_dose import DoseResponse

#: what a user can do about a dose too low to use
MORE_DOSE = "record at a higher dose (a longer dwell or more beam current)"


def dose_message(dose: float, trained: tuple[float, float] | None, curve: DoseResponse | None) -> str:
    """The warning for a scan at ``dose`` e/Angstrom^2 below ``trained`` (low, high e/Angstrom^2; None: the
    model was trained noise-free), with what ``curve`` measured there when the card has one."""
    where = ("but the model was trained noise-free" if trained is None else
             f"below the {trained[0]:g}-{trained[1]:g} e/Angstrom^2 the model was trained at")
    said = f"the data carry a dose of about {dose:.3g} e/Angstrom^2, {where}"
    if curve is None:
        return f"{said}; expect more error" + (" at low dose" if trained is None else "")
    found = curve.at(dose)
    measured = (f"the card's dose curve gives a potential rel. L2 of {found.network:.2f} (interval up to "
                f"{found.network_high:.2f}) for the network against {found.constant:.2f} for a constant map and "
                f"{found.mean_image:.2f} for the mean image, maps that ignore the data ({found.how}; field's rule, "
                f"{curve.n_samples} {curve.split} samples)")
    if found.unusable:
        return f"{said}; {measured}: unusable, the maps are not shown better than ignoring the data; {MORE_DOSE}"
    return f"{said}; {measured}: expect that much error"


__all__ = ["dose_message", "MORE_DOSE"]
