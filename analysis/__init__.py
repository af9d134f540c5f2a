"""The analyses, one subpackage each, reading records and predictions only: `aotl`
(accuracy on the line and the aotl-study), `oodselect`, `validity`, `labelfree`, `card`
(benchmark cards), with `theory` (the accuracy-on-the-line theorems and simulations),
`plots` and `selection_stats` (how sure a ranking is) beside them."""
