"""From run directories to numbers: reading records (`records`), model selection
(`model_selection`), the tables collect_results and the leaderboard share (`report`,
laid out by `tables`)."""
