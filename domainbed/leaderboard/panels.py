"""Analysis panels: accuracy on the line per dataset (``analysis.aotl``) and OODSelect
curves from an OODSelect output directory (``python -m analysis.oodselect --out DIR``).

Each panel returns (html, data): the html refers to image files written into the site's
``img/`` folder; data goes into leaderboard.json. A panel that cannot be drawn says why.
"""
import csv
import os
import shutil

from domainbed.leaderboard.pages import esc, slug
from oodutils.errors import UserError

OODSELECT_SUMMARY = "summary.csv"
OODSELECT_CURVE = "correlation_vs_size.png"
OODSELECT_COLUMNS = ("method", "n", "r_test", "r_test_lo", "r_test_hi", "r_val")


def aotl_panel(records, label, site_dir):
    """Probit scatter, fit and well-specified verdict per leave-one-domain-out split of
    one dataset (all checkpoints of the runs with one test environment)."""
    from analysis import aotl
    from analysis.aotl_inputs import accuracies_from_records
    title = "<h2>Accuracy on the line (probit axes)</h2>"
    try:
        acc = accuracies_from_records(records, split="out", checkpoints="all")
        table = aotl.per_ood_table(acc)
    except UserError as e:
        return (f'<section class="analysis">{title}<p class="missing">Not drawn: {esc(e)}'
                '</p></section>', {"missing": str(e)})
    dataset = acc.datasets()[0]
    splits, figures = [], []
    for row in table.to_dict("records"):
        ood = int(row["ood_env"])
        name = f"img/aotl_{slug(label)}_env{ood}.png"
        try:
            aotl.plot_split(acc, dataset, ood, os.path.join(site_dir, name))
        except UserError as e:
            name = None
            figures.append(f'<p class="missing">OOD env {ood}: not drawn: {esc(e)}</p>')
        split = {"ood_env": ood, "n": int(row["n"]), "slope": float(row["slope"]),
                 "r": float(row["r"]), "verdict": str(row["verdict"]),
                 "well_specified": bool(row["well_specified"]), "image": name}
        splits.append(split)
        if name:
            figures.append(
                f'<figure class="panel"><img src="{esc(name)}" alt="accuracy on the line, '
                f'OOD env {ood}"><figcaption>OOD env {ood}: R = {split["r"]:.2f}, slope '
                f'{split["slope"]:.2f}, {split["n"]} checkpoints: <b>{esc(split["verdict"])}'
                '</b></figcaption></figure>')
    rows = "".join(f'<tr><td>{s["ood_env"]}</td><td>{s["n"]}</td><td>{s["slope"]:.3f}</td>'
                   f'<td>{s["r"]:.3f}</td><td>{esc(s["verdict"])}</td></tr>' for s in splits)
    notes = "".join(f"<li>{esc(n)}</li>" for n in acc.notices)
    html = (f'<section class="analysis">{title}<p>Per split: probit(mean ID accuracy) '
            'against probit(OOD accuracy), one point per checkpoint; well-specified when '
            'R &lt; 0.3 (analysis.aotl).</p><table><thead><tr><th>OOD env</th><th>n</th>'
            f'<th>slope</th><th>R</th><th>verdict</th></tr></thead><tbody>{rows}</tbody>'
            f'</table>{"".join(figures)}{f"<ul>{notes}</ul>" if notes else ""}</section>')
    return html, {"splits": splits, "notices": list(acc.notices)}


def check_oodselect_dir(path):
    """Raise UserError unless `path` is an OODSelect output directory."""
    if not os.path.isdir(path):
        raise UserError(f"--oodselect {path!r} is not a directory")
    if not os.path.isfile(os.path.join(path, OODSELECT_SUMMARY)):
        raise UserError(f"--oodselect {path!r} has no {OODSELECT_SUMMARY} (is it the --out "
                        "directory of python -m analysis.oodselect?)")


def _read_summary(path):
    with open(os.path.join(path, OODSELECT_SUMMARY), newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _dataset_of(path):
    import json
    try:
        with open(os.path.join(path, "subsets.json"), encoding="utf-8") as f:
            return (json.load(f).get("info") or {}).get("dataset")
    except (OSError, ValueError):
        return None


def oodselect_panel(path, number, site_dir):
    """The correlation-vs-size curve and the summary table of one OODSelect output."""
    rows = _read_summary(path)
    dataset = _dataset_of(path)
    image = None
    if os.path.isfile(os.path.join(path, OODSELECT_CURVE)):
        image = f"img/oodselect_{number}.png"
        os.makedirs(os.path.join(site_dir, "img"), exist_ok=True)
        shutil.copyfile(os.path.join(path, OODSELECT_CURVE), os.path.join(site_dir, image))
    columns = [c for c in OODSELECT_COLUMNS if rows and c in rows[0]]
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{esc(_short(r[c]))}</td>" for c in columns) +
                   "</tr>" for r in rows)
    figure = (f'<figure class="panel"><img src="{esc(image)}" alt="OODSelect curve">'
              '<figcaption>Correlation between ID and OOD accuracy on the selected subset, '
              'by subset size</figcaption></figure>' if image else
              f'<p class="missing">No {OODSELECT_CURVE} in {esc(path)} (run without '
              '--no-plots to draw it)</p>')
    html = (f'<section class="analysis"><h2>OODSelect: {esc(dataset or path)}</h2>'
            f'<p>From <code>{esc(path)}</code>.</p>{figure}<table><thead><tr>{head}</tr>'
            f'</thead><tbody>{body}</tbody></table></section>')
    return html, {"dir": path, "dataset": dataset, "image": image, "summary": rows}


def _short(value):
    try:
        return f"{float(value):.3f}" if "." in value else value
    except ValueError:
        return value
