"""A static leaderboard site from sweeps, with published reference numbers beside them.

    python -m domainbed.scripts.leaderboard --input_dir SWEEP [--input_dir SWEEP ...]
        --output_dir SITE_DIR [--oodselect DIR ...]

``model`` builds the numbers (with collect_results' own functions), ``published`` reads
the shipped reference numbers (``data/``), ``pages`` lays the numbers out as view data
that the Jinja2 templates in ``templates/`` render (autoescaped), ``panels`` draws the
analysis panels and ``site`` writes it all atomically.
"""
from domainbed.leaderboard.site import build_site

__all__ = ["build_site"]
