"""Exit codes of `namsa`: every error class's kind decides its status through `workflow.cli.main`.

0 done; 1 the run or the environment failed (`namsa.errors.RunError`); 2 bad input
(`namsa.errors.UserError`); 130 Ctrl-C. The classes are found by importing every module of the five
packages, so a new class is checked the day it is written: one of no decided kind (a bare
`NamsaError`, or both kinds at once) makes `main` raise, and a new `RunError` must be added to
`RUN_ERRORS` on purpose.
"""
from __future__ import annotations

import errno
import importlib
import inspect
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import workflow.cli as cli
from namsa.errors import NamsaError, RunError, UserError
from workflow.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, StageFailed

PACKAGES = ("namsa", "stage", "models", "evaluation", "workflow")
REPO = Path(__file__).resolve().parents[1]
MICRO = REPO / "configs" / "micro.yaml"

#: the classes whose failure is the run's or the environment's, not the input's (exit 1)
RUN_ERRORS = {
    "models.checkpoint.CheckpointWriteError",       # a checkpoint write failed (disk full, file size limit)
    "models.distributed.errors.PeerFailureError",   # a peer rank died or hung
    "models.training.errors.NonFiniteLossError",    # the loss diverged
    "stage.errors.StoreFullError",                  # the disk (or the map size limit) filled up
    "workflow.errors.StageFailed",                  # a stage of `namsa run` crashed
}


def _import_every_module() -> None:
    for name in PACKAGES:
        package = importlib.import_module(name)
        for module in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(module.name)


def _subclasses(root: type) -> list[type]:
    found: dict[str, type] = {}
    stack = [root]
    while stack:
        for cls in stack.pop().__subclasses__():
            if cls.__module__.split(".")[0] in PACKAGES:  # not a class a test defines
                found.setdefault(_name(cls), cls)
            stack.append(cls)
    return [found[name] for name in sorted(found)]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_import_every_module()
ERROR_CLASSES = [NamsaError, *_subclasses(NamsaError)]  # UserError and RunError among them


def _instance(cls: type) -> NamsaError:
    """``cls`` made with a text for each required argument (most take one message)."""
    params = [p for p in list(inspect.signature(cls.__init__).parameters.values())[1:]
              if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return cls(*[f"the {p.name} of a {cls.__name__}" for p in params])


def _main_raising(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> int:
    """`main` on a real command line whose subcommand (inspect) raises ``exc``."""
    def raising(_args: object) -> int:
        raise exc
    monkeypatch.setattr(cli, "cmd_inspect", raising)
    return cli.main(["inspect", "somewhere"])


def test_the_walk_finds_the_classes_of_every_room():
    rooms = {cls.__module__.split(".")[0] for cls in ERROR_CLASSES}
    assert rooms == set(PACKAGES)
    assert {_name(cls) for cls in ERROR_CLASSES if issubclass(cls, RunError) and cls is not RunError} == RUN_ERRORS


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=_name)
def test_no_error_is_a_value_error(cls):
    """A caller's ``except ValueError`` (or a pydantic validator) must never swallow a namsa error."""
    assert not issubclass(cls, ValueError)


@pytest.mark.parametrize("cls", [c for c in ERROR_CLASSES if c is not NamsaError], ids=_name)
def test_each_error_exits_with_its_kind_and_one_line(cls, monkeypatch, capsys):
    exc = _instance(cls)
    rc = _main_raising(monkeypatch, exc)
    expected = EXIT_FAILED if _name(cls) in RUN_ERRORS or cls is RunError else EXIT_BAD_INPUT
    assert rc == expected, f"{_name(cls)} exits {rc}; decide its kind (UserError or RunError) on purpose"
    assert capsys.readouterr().err == f"namsa: error: {exc}\n"


def test_an_error_of_no_decided_kind_is_refused_not_guessed(monkeypatch):
    class Undecided(NamsaError):
        pass

    class Both(UserError, RunError):
        pass

    for cls in (NamsaError, Undecided, Both):
        with pytest.raises(TypeError, match="must subclass exactly one of"):
            _main_raising(monkeypatch, cls("no kind"))


def test_a_failed_stage_prints_its_log_tail_below_the_line(monkeypatch, capsys):
    rc = _main_raising(monkeypatch, StageFailed("training failed (boom); log: run/logs/train.log", "line 1\nline 2"))
    assert rc == EXIT_FAILED
    assert capsys.readouterr().err == "namsa: error: training failed (boom); log: run/logs/train.log\nline 1\nline 2\n"


#: errno -> exit status: the environment failed (1), or the path given cannot be used (2)
OS_ERROR_STATUS = {errno.ENOSPC: EXIT_FAILED, errno.EDQUOT: EXIT_FAILED, errno.EFBIG: EXIT_FAILED,
                   errno.EIO: EXIT_FAILED, errno.EMFILE: EXIT_FAILED, errno.EACCES: EXIT_BAD_INPUT,
                   errno.EROFS: EXIT_BAD_INPUT, errno.ENOTDIR: EXIT_BAD_INPUT, errno.ENOENT: EXIT_BAD_INPUT,
                   errno.ENAMETOOLONG: EXIT_BAD_INPUT}


@pytest.mark.parametrize("code, expected", OS_ERROR_STATUS.items(), ids=[errno.errorcode[c] for c in OS_ERROR_STATUS])
def test_an_os_error_exits_by_its_errno(code, expected, monkeypatch, capsys):
    """A full disk, a quota, a file size limit or an I/O error is the environment (1); a path the user
    gave that cannot be used is bad input (2). Either way one line: the path, the reason, what to do."""
    rc = _main_raising(monkeypatch, OSError(code, os.strerror(code), "/data/store-000/data.mdb"))
    err = capsys.readouterr().err
    assert rc == expected
    assert err.startswith(f"namsa: error: inspect /data/store-000/data.mdb: {os.strerror(code)}; ") and err.count("\n") == 1


def test_a_memory_shortage_is_one_kind_before_and_during_a_run(tmp_path, monkeypatch, capsys):
    """The estimate's refusal before anything runs and running out of memory (a MemoryError, or torch's
    out-of-memory error of a GPU) are one kind, `MemoryShortage`: bad input for this machine, exit 2."""
    import torch

    from namsa.errors import MemoryShortage
    from namsa.multislice import MemoryBudgetError

    assert issubclass(MemoryBudgetError, MemoryShortage)
    before = cli.main(["simulate", str(MICRO), "--out", str(tmp_path / "out"), "--no-progress",
                       "--set", "simulation.memory_budget_gb=100000"])
    err = capsys.readouterr().err
    assert before == EXIT_BAD_INPUT and err.count("\n") == 1 and "is more than this machine's" in err
    for exc in (MemoryError(), torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")):
        assert _main_raising(monkeypatch, exc) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err.startswith("namsa: error: inspect ran out of memory; ") and err.count("\n") == 1


def test_another_runtime_error_is_not_taken_for_a_memory_shortage(monkeypatch):
    with pytest.raises(RuntimeError, match="not memory"):
        _main_raising(monkeypatch, RuntimeError("not memory"))


def test_a_child_leaves_its_kind_for_the_command_that_started_it(tmp_path):
    """A `namsa` process whose environment names a status folder (as `namsa run` does for its training)
    leaves its status and line there: a launcher that exits 1 whatever its ranks did (torchrun)
    cannot turn a refused input into a failed run."""
    from workflow.child_status import STATUS_ENV, refused_input

    folder = tmp_path / "status"
    folder.mkdir()
    env = {**os.environ, STATUS_ENV: str(folder)}
    done = subprocess.run([sys.executable, "-m", "workflow.cli", "inspect", str(tmp_path / "nothing")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == EXIT_BAD_INPUT
    line = done.stderr.strip().removeprefix("namsa: error: ")
    assert refused_input(folder, exit_status=EXIT_FAILED) == line and line.startswith("no store at")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert refused_input(empty, exit_status=EXIT_FAILED) is None
    assert refused_input(empty, exit_status=EXIT_BAD_INPUT) == ""  # argparse's own exit 2: the log has the line


def test_ctrl_c_keeps_its_own_status(monkeypatch, capsys):
    assert _main_raising(monkeypatch, KeyboardInterrupt()) == EXIT_INTERRUPTED
    assert capsys.readouterr().err.startswith("namsa: interrupted; ")


def test_a_real_bad_input_exits_2_and_a_real_os_error_of_the_environment_exits_1(tmp_path, capsys):
    """No stand-in: a store that is not there (bad input), and a write past a real file size limit."""
    assert cli.main(["inspect", str(tmp_path / "nothing")]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("namsa: error: no store at")
    from workflow.oserrors import os_error_kind

    with pytest.raises(OSError) as missing:
        (tmp_path / "no" / "such" / "dir" / "file").write_text("x")
    assert os_error_kind(missing.value) is UserError
    too_large = _write_past_a_file_size_limit(tmp_path / "big")
    assert too_large == errno.EFBIG and os_error_kind(OSError(too_large, os.strerror(too_large))) is RunError


def _write_past_a_file_size_limit(path: os.PathLike) -> int:
    """The errno of a write past RLIMIT_FSIZE in a child process (SIGXFSZ ignored, as a full disk would)."""
    child = ("import os, resource, signal, sys\n"
             "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
             "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
             "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
             "try:\n    while True:\n        os.write(fd, b'x' * 600)\nexcept OSError as exc:\n    sys.exit(exc.errno)\n")
    return subprocess.run([sys.executable, "-c", child, str(path)], timeout=60).returncode
