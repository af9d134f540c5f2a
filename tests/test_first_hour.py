"""A newcomer's first hour, as CI sees it: clone the repository into a temporary folder,
make a new virtual environment there (not activated; it reuses the installed torch through
--system-site-packages), and run the README's install command and main command in it
(the main command at --smoke size). A broken install or quickstart fails here."""
import os
import subprocess
import sys

import pytest

from tests.test_readme import REPO, readme_blocks

INSTALL = "python3 -m pip install -e ."
MAIN = "python3 scripts/quickstart.py"


def readme_main_block():
    """The README block holding the two commands: install, then the main job."""
    for block in readme_blocks((REPO / "README.md").read_text()):
        if INSTALL in block.code and MAIN in block.code:
            return block
    raise AssertionError(f"no README block runs {INSTALL!r} and {MAIN!r}")


def test_readme_names_the_install_and_the_main_command():
    line = next(line for line in readme_main_block().code.splitlines() if MAIN in line)
    assert line.split("#")[0].strip() == f"{INSTALL} && {MAIN}"


@pytest.mark.slow
@pytest.mark.timeout(3600)   # a clone, an install and the quickstart: ~1,600 s loaded
def test_fresh_clone_installs_and_runs_the_main_command(tmp_path):
    clone = tmp_path / "oodbed"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, timeout=300)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    # the README's commands, with the new environment's interpreter for python3
    install = INSTALL.replace("python3", python, 1)
    done = subprocess.run(install.split() + ["--quiet"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = subprocess.run([python, "-c", "import domainbed, sys; print(domainbed.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert found.stdout.strip().startswith(str(clone)), found.stdout + found.stderr
    main = MAIN.replace("python3", python, 1).split() + ["--smoke"]
    done = subprocess.run(main, cwd=clone, env=env, capture_output=True, text=True,
                          timeout=3000)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "training-domain validation set" in done.stdout
    site = clone / "sweeps" / "quickstart" / "leaderboard" / "index.html"
    assert site.exists() and str(site.parent) in done.stdout
