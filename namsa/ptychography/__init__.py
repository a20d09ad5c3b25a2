"""Ptychography through py4DSTEM (optional dependency): the iterative phase retrieval microscopists use,
single-slice and multislice, iterated until the solver's own data error stops falling. The evaluation's
baselines (`evaluation.baselines`) score it against the network; `models` refines a network's map
with it (a learned start refined by physics). Nothing here reads a truth."""
