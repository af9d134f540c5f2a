"""Small helpers shared by every package of this project (domainbed, analysis, ood_bench,
spawrious), so that each package reads on its own and none reaches into another's internals
for generic utilities:

- ``oodutils.errors``   UserError and UnknownNameError, ``run_cli`` (one ``error:`` line,
                        exit 2), ``epilog_example`` for ``--help``, ``require`` (optional
                        packages name the extra that installs them)
- ``oodutils.fileio``   atomic writes (bytes, text, JSON, npz, torch), output-path checks,
                        strict JSON
- ``oodutils.tables``   one table renderer: text, markdown, LaTeX, CSV and HTML, one LaTeX
                        escaper
- ``oodutils.templating`` HTML from Jinja2 templates (autoescape, strict), one environment
                        per package, the rule for which links a page may write
- ``oodutils.accuracy`` ``probit(acc, clip=...)`` with the named clip constants, and
                        ``check_accuracies`` (finite fractions in [0, 1])
- ``oodutils.cli``      ``parse_json_object`` (the ``--hparams`` parser) and the ``-v`` /
                        ``-q`` flags
- ``oodutils.log``      one logger per package, bare messages on stderr by default

It depends on numpy, pandas and jinja2 only (torch and matplotlib when a caller hands it
their objects), and on nothing else in this repository.
"""
