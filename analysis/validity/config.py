"""The benchmark-validity vocabulary: the desiderata's default thresholds, the method-choice
strategies and the split codes of prediction files. A module without pandas or scipy, so
the `benchmark-validity` command builds its parser (and answers --help) before importing
them."""

DEFAULT_THRESHOLDS = {"erm_failure": 5.0, "disc_power": 2.5, "conv_validity": 0.1}
STRATEGIES = ("all", "valid", "closest")
SPLIT_CODES = {"in": 0, "out": 1, "uda": 2}
