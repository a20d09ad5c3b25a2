"""Ptychography through py4DSTEM (optional dependency): the iterative phase retrieval microscopists use,
single-slice (`single_slice`) and multislice (`multislice`), iterated until the solver's own data error
stops falling (`convergence`); `object_grid` maps between a sample's target grid and the solver's
object grid. The evaluation's baselines (`evaluation.baselines`) score it against the network; `refine`
starts it from a network's map (a learned start refined by physics; `models` calls it). Nothing here
reads a truth."""
