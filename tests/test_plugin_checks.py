"""Plug-ins and their hyperparameter ranges (issue 43, item 1): the plug-ins guide's example
follows its own rule, registering a hyperparameter without a valid range warns naming the
class and its module, the project's registry tests cover the project's classes only, and
`domainbed-check-plugins` checks the installed plug-ins instead."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from domainbed import registry
from domainbed.hparams import Hparam, draw_problems, range_problems

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plugin_package(root, source):
    """An installed-looking package `my_plugin` with one algorithm entry point, MyERM."""
    pkg = root / "my_plugin"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(source))
    dist = root / "my_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[domainbed.algorithms]\nMyERM = my_plugin:MyERM\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), REPO])}


UNRANGED = """
    from domainbed.algorithms.erm import ERM
    from domainbed.hparams import Hparam

    class MyERM(ERM):
        HPARAMS = {"my_weight": Hparam(1.0, lambda r: 10 ** r.uniform(-1, 1))}
"""
RANGED = UNRANGED.replace("r.uniform(-1, 1))", "r.uniform(-1, 1), low=0.1, high=10.0)")


def python(env, code, *flags):
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True,
                          text=True, env=env, cwd=REPO, timeout=300)


def guide_example():
    """The plug-ins guide's MyERM block."""
    text = open(os.path.join(REPO, "docs", "guide", "plugins.md")).read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return next(b for b in blocks if "class MyERM" in b)


def test_the_guides_example_declares_valid_ranges():
    code = guide_example() + "\nprint('registered', MyERM.registry_name)"
    proc = python(os.environ, code, "-W", "error::UserWarning")
    assert proc.returncode == 0 and "registered MyERM" in proc.stdout, proc.stderr[-2000:]


def test_registering_a_hyperparameter_without_a_range_warns_naming_the_class():
    reg = registry.Registry("algorithm", "oodbed.tests.no_such_group", "domainbed.algorithms")

    class Unranged:
        HPARAMS = {"my_weight": Hparam(1.0, lambda r: r.uniform(0, 2))}

    with pytest.warns(registry.HparamRangeWarning,
                      match=r"algorithm 'Mine' \(.*test_plugin_checks.*Unranged\): "
                            r"hyperparameter 'my_weight' declares no valid range"):
        reg.register("Mine")(Unranged)

    class OutOfRange:
        HPARAMS = {"w": Hparam(5.0, lambda r: 1.0, low=0.0, high=1.0)}

    with pytest.warns(registry.HparamRangeWarning, match="default of 'w' is not valid"):
        reg.register("Other")(OutOfRange)
    assert range_problems(OutOfRange) and not range_problems(Unranged.__base__)


def test_draw_problems_find_a_draw_outside_its_range():
    class Drifting:
        HPARAMS = {"w": Hparam(0.5, lambda r: 2.0, low=0.0, high=1.0)}
    problems = draw_problems(Drifting)
    assert problems and "w=2.0" in problems[0]


def test_the_projects_registry_tests_cover_its_own_classes_only(tmp_path):
    """An installed plug-in that breaks the rules does not turn the project's tests red:
    they walk the project's own classes; the plug-in still registers (with a warning)."""
    env = plugin_package(tmp_path / "site", UNRANGED)
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import tests.test_algorithms_registry as t\n"
            "from domainbed import registry\n"
            "print('MyERM' in t.NAMES, 'ERM' in t.NAMES, registry.ALGORITHMS.plugin_names())")
    proc = python(env, code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[-2] == "False True ['MyERM']"
    assert "algorithm 'MyERM' (my_plugin.MyERM): hyperparameter 'my_weight' declares no " \
        "valid range" in proc.stderr


def check_plugins(env):
    return subprocess.run([sys.executable, "-m", "domainbed.scripts.check_plugins"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=300)


def test_check_plugins_fails_a_plugin_without_ranges_and_passes_a_good_one(tmp_path):
    bad = check_plugins(plugin_package(tmp_path / "bad", UNRANGED))
    assert bad.returncode == 1, bad.stderr[-2000:]
    assert "FAIL algorithm MyERM (my_plugin.MyERM): hyperparameter 'my_weight' declares no " \
        "valid range" in bad.stdout
    good = check_plugins(plugin_package(tmp_path / "good", RANGED))
    assert good.returncode == 0, good.stdout + good.stderr[-2000:]
    assert "ok   algorithm MyERM (my_plugin.MyERM)" in good.stdout
    assert "1 of 1 plug-in(s) pass" in good.stdout
