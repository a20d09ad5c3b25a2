"""The run directory of `namsa run`: its layout (RunPaths), the refusal of symbolic links inside it
and of summary paths outside it, and the log of simulation failures (FailureLog).

Run directory (default ``runs/<name>/``)::

    config.resolved.yaml   every key, defaults included
    data/                  one store per simulation task (or a link to execution.data_dir)
    checkpoints/, model/   training output of models.train (with train_run.json, metrics.csv);
                           train-summary.json marks a finished training
    eval/                  metrics.json, figures, report.html (eval-summary.json marks it done)
    logs/                  progress files, simulate-failures.json, train.log, run.log
    runinfo/               Parsl's run_dir (its logs; no memo checkpoints are written or read)
    summary.json           what the last run did, with paths and timings
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from namsa.errors import UserError
from stage.config import expand_path

from .config import PipelineConfig
from .model_runners import TRAIN_SUMMARY
from .runner_io import write_summary_json

#: what models.train writes into its output directory (the run directory) to record the run
TRAIN_RUN_FILE = "train_run.json"


#: names inside a run directory that namsa writes through: none may be a symbolic link (a run
#: directory someone sent could otherwise redirect the writes, or the reads of a resumed run)
RUN_PARTS = ("data", "logs", "checkpoints", "model", "eval", "runinfo", "previous", "config.resolved.yaml",
             "summary.json", "metrics.csv", TRAIN_RUN_FILE, TRAIN_SUMMARY)


@dataclass
class RunPaths:
    """The layout of one run directory.

    Symbolic links: the run directory itself may be one (the user chose it). Inside it no part in
    `RUN_PARTS` may be a link, with one exception: ``data`` may be the link namsa makes to the
    configured ``execution.data_dir``; a link to anywhere else is refused (`check_parts`).
    """

    root: Path
    data: Path

    @classmethod
    def for_config(cls, cfg: PipelineConfig, run_dir: str | Path | None) -> "RunPaths":
        root = (Path(run_dir) if run_dir is not None else Path("runs") / cfg.name).resolve()
        # execution.data_dir may name $SCRATCH, $TMPDIR, ~ ... (expanded where the driver runs);
        # <run>/data is not resolved: a link there is checked, not followed
        data = expand_path(cfg.execution.data_dir, "execution.data_dir").resolve() if cfg.execution.data_dir \
            else root / "data"
        return cls(root=root, data=data)

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def resolved_config(self) -> Path:
        return self.root / "config.resolved.yaml"

    def check_parts(self) -> None:
        """Refuse a symbolic link in the run directory: a part in `RUN_PARTS`, or anything at any
        depth below one (logs/train.log, data/store-000, data/.claims/..., checkpoints/...), since
        namsa writes and reads through all of them (see the class docstring)."""
        for name in RUN_PARTS:
            part = self.root / name
            if part.is_symlink():
                if self._own_data_link(part):
                    continue   # the link namsa made to execution.data_dir: the configured place
                self._refuse_link(part, "replace the link by a directory (for stores elsewhere set "
                                        "execution.data_dir)")
            elif part.is_dir():
                self._refuse_links_below(part)

    def _own_data_link(self, part: Path) -> bool:
        if part.name != "data" or self.data == part:
            return False
        try:
            return (part.parent / os.readlink(part)).resolve() == self.data
        except (RuntimeError, OSError):   # a loop of links (RuntimeError before Python 3.13): nobody's data dir
            return False

    def _refuse_links_below(self, folder: Path) -> None:
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            for name in dirnames + filenames:
                if os.path.islink(os.path.join(dirpath, name)):
                    self._refuse_link(Path(dirpath, name), "replace the link by the file or folder itself")

    def _refuse_link(self, link: Path, fix: str) -> None:
        raise UserError(f"run directory {self.root}: {link.relative_to(self.root)} is a symbolic link to "
                        f"{os.readlink(link)}; namsa reads and writes only inside the run directory: {fix}, "
                        f"or choose another --out")

    def create(self) -> None:
        self.check_parts()
        for path in (self.root, self.data, self.eval, self.logs):
            try:
                path.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                blocker = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), path)
                raise UserError(f"run directory {self.root}: {blocker} is a file, not a directory; choose "
                                f"another --out") from None
            except PermissionError:
                raise UserError(f"run directory {self.root}: permission denied creating {path}; choose a "
                                f"writable --out") from None
        link = self.root / "data"
        if self.data != link and not link.exists() and not link.is_symlink():
            link.symlink_to(self.data, target_is_directory=True)

    def inside(self, text: Any, what: str) -> Path:
        """``text`` (a path read from a JSON file in the run directory) resolved, refused with one line
        unless it lies inside the run directory.

        Relative paths are relative to the run directory (what namsa writes, so the directory can be
        moved); an absolute path of another place is read as the same path below this run directory
        where that exists (a summary written before paths were relative, then moved with `mv`)."""
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"run directory {self.root}: {what} in a summary is {text!r}, not a path; a summary "
                            f"namsa writes names a path: use the run directory as namsa wrote it, or choose "
                            f"another --out")
        path = Path(text)
        resolved = (self.root / path).resolve() if not path.is_absolute() else path.resolve()
        if not resolved.is_relative_to(self.root):
            resolved = self._moved(path)
        if resolved is None:
            raise UserError(f"run directory {self.root}: {what} {text!r} in a summary lies outside the run "
                            f"directory; namsa reads only inside it: use the run directory as namsa wrote it, "
                            f"or choose another --out")
        return resolved

    def _moved(self, path: Path) -> Path | None:
        """The longest tail of ``path`` that exists below the run directory (None if none does)."""
        parts = path.parts[1:]
        for start in range(len(parts)):
            candidate = self.root.joinpath(*parts[start:]).resolve()
            if candidate.is_relative_to(self.root) and candidate != self.root and candidate.exists():
                return candidate
        return None


class FailureLog:
    """Simulation failures of this physics config, kept in logs/simulate-failures.json.

    A sample that failed is not retried by later runs (rerun with --retry-failed to try again).
    """

    def __init__(self, path: Path, physics_hash: str):
        self.path = path
        self.physics_hash = physics_hash
        payload = json.loads(path.read_text()) if path.exists() else {}
        same = payload.get("physics_hash") == physics_hash
        self.entries: dict[str, str] = dict(payload.get("failures", {})) if same else {}

    def record(self, items: Sequence[tuple[str, str]]) -> None:
        self.entries.update({who: why for who, why in items})
        write_summary_json(self.path, {"physics_hash": self.physics_hash, "failures": self.entries})

    def forget(self) -> None:
        self.entries = {}
        write_summary_json(self.path, {"physics_hash": self.physics_hash, "failures": {}})
