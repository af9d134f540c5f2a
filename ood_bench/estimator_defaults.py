"""Algorithm 2's default settings (Ye et al. 2022, OoD-Bench): importance sample size M,
the thresholds eps_div and eps_cor, and the KDE bandwidth rule. A module without torch, so
the `ood-bench` command builds its parser (and answers --help) before importing torch."""

DEFAULTS = {"sample_size": 10000, "eps_div": 1e-12, "eps_cor": 5e-4, "bw_method": "scott"}
