"""The README's notebook example runs exactly as written, against a quickstart-shaped run directory
(the shared tiny store and tiny trained reconstructor, linked where `make demo` puts its outputs), and
its shell commands (and those of docs/) work as written in a fresh shell after `make demo`."""
from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import numpy as np

from _models_fixture import tiny_trained_model  # noqa: F401  (session fixture)

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: the line that puts the venv's scripts on PATH (python -m venv writes bin/activate)
ACTIVATE = re.compile(r"^(\.|source) \.venv/bin/activate\b")


def python_block(heading: str) -> str:
    """The first python block of the README section that starts with ``heading``, verbatim."""
    section = README.read_text().split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def notebook_example() -> str:
    return python_block("## From a notebook")


def test_readme_notebook_example_runs_as_written(tiny_trained_model, tiny_data_dir, tmp_path,  # noqa: F811
                                                 monkeypatch):
    run = tmp_path / "runs" / "quickstart"
    (run / "data").mkdir(parents=True)
    (run / "data" / "store-000").symlink_to(tiny_data_dir / "store-0", target_is_directory=True)
    (run / "model").symlink_to(tiny_trained_model.model_dir, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(notebook_example(), str(README), "exec"), scope)
    assert scope["sample"].cbed.shape == (1024, 32, 32)
    patterns, info = scope["patterns"], scope["info"]
    assert patterns.shape == (2, *info["gpts"]) and len(info["cell_A"]) == 3
    assert np.all(patterns.sum(axis=(1, 2)) <= 1.0 + 1e-5) and patterns.sum(axis=(1, 2)).min() > 0.5
    assert np.isfinite(scope["potential"]).all()


def test_readme_pretrained_example_runs_as_written(tmp_path, monkeypatch):
    """The study section's example: the shipped reconstructor on a (1024, 32, 32) scan from a file."""
    import namsa

    sample = namsa.simulate_sample(namsa.load_structure("Si-diamond"), (0, 0, 1),
                                   namsa.SimulationConfig(scan_shape=(32, 32), pattern_px=32, target_px=32))
    np.save(tmp_path / "scan.npy", sample.cbed)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(python_block("## Does the network beat"), str(README), "exec"), scope)
    assert scope["potential"].shape == scope["density"].shape == (32, 32)
    r = np.corrcoef(scope["potential"].ravel(), sample.potential.ravel())[0, 1]
    assert r > 0.8, r   # a real reconstruction of a material it was trained on, not just the right shape
    # in focus, within the training physics: no finding (its y and x parallax once read two aliases of the
    # focus, -277 and +26 A, and told the reader its maps were not trustworthy)
    from models.scan_fit import OutsideTrainingWarning
    assert [str(w.message) for w in caught if issubclass(w.category, OutsideTrainingWarning)] == []


def shell_blocks() -> list[tuple[str, list[str]]]:
    """The fenced non-Python code blocks of README.md and docs/*.md: (file name, lines)."""
    blocks = []
    for path in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for lang, body in re.findall(r"```(\w*)\n(.*?)```", path.read_text(), re.S):
            if lang != "python":
                blocks.append((path.name, body.splitlines()))
    return blocks


def test_namsa_commands_work_as_written_in_a_fresh_shell():
    """`namsa` is .venv/bin/namsa (not on PATH): a block's command line either names that path or
    follows the activation line in the same block."""
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "namsa" in script and re.search(r"^VENV\s*\?=\s*\.venv$", (ROOT / "Makefile").read_text(), re.M)
    checked = 0
    for name, lines in shell_blocks():
        active = False
        for line in lines:
            active = active or bool(ACTIVATE.match(line))
            if re.match(r"\s*namsa ", line):
                assert active, f"{name}: {line!r} is 'command not found' in a fresh shell: write .venv/bin/namsa"
                checked += 1
            elif line.startswith(".venv/bin/"):
                assert line.split()[0] in {".venv/bin/namsa", ".venv/bin/python", ".venv/bin/pip"}, (name, line)
                checked += 1
    assert checked >= 10   # the README synopsis, docs/experimental-data.md, docs/evaluation.md


def test_readme_make_commands_are_makefile_targets():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    said = re.findall(r"`make ([\w-]+)", README.read_text())
    said += [line.split()[1] for _, lines in shell_blocks() for line in lines if line.startswith("make ")]
    assert {"demo", "test", "notebook"} <= set(said) and set(said) <= targets, set(said) - targets


def test_readme_says_what_the_first_make_test_builds():
    """The first `make test` builds the patched Horovod wheel (its prerequisite horovod-cached): the
    README says so, how long it takes, and where the wheel is cached (the script's default)."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: .*\bhorovod-cached\b", makefile, re.M)
    readme = " ".join(README.read_text().split())
    first = readme[readme.index("The first `make test`"):]
    first = first[:first.index("## ")]
    assert "`make horovod-cached`" in first and "scripts/build_horovod.sh" in first and "minutes" in first
    script = (ROOT / "scripts" / "build_horovod.sh").read_text()
    assert "${NAMSA_WHEEL_CACHE:-$HOME/.cache/namsa/wheels}" in script
    assert "`~/.cache/namsa/wheels`" in first and "`NAMSA_WHEEL_CACHE`" in first
    # said before the first command that needs it, near the top
    assert readme.index("The first `make test`") < readme.index("## Does the network beat")
    assert readme.index(". .venv/bin/activate") < readme.index("## Does the network beat")
