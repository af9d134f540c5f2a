"""Which splits a run evaluates (`--eval_splits`): checked when a run is configured, before
any heavy import, and applied to the run's named splits."""
import re
from typing import Any

from oodutils.errors import UserError

# --eval_splits tokens: every split, a kind of split in every environment, every split of
# the test / training environments, or one split by name (env2_in).
EVAL_SPLIT_TOKENS = ("all", "in", "out", "uda", "test", "train")
_SPLIT_NAME = re.compile(r"^env(\d+)_(in|out|uda)$")


def check_eval_splits(tokens: Any) -> None:
    for token in tokens or []:
        if token not in EVAL_SPLIT_TOKENS and not _SPLIT_NAME.match(token):
            raise UserError(f"--eval_splits {token!r}: not one of "
                            f"{', '.join(EVAL_SPLIT_TOKENS)} or a split name like env0_out")


def select_splits(named_splits: Any, tokens: Any, test_envs: Any) -> list[Any]:
    """The named splits that `--eval_splits` keeps (the union of its tokens), in their
    order. None or ["all"] keeps every split (DomainBed's behaviour)."""
    tokens = list(tokens or ["all"])
    check_eval_splits(tokens)
    names = {name for name, _, _, _ in named_splits}
    for token in tokens:
        if _SPLIT_NAME.match(token) and token not in names:
            raise UserError(f"--eval_splits {token}: this run has no such split "
                            f"(splits: {', '.join(sorted(names))})")

    def kept(name: str, env_i: Any, kind: Any) -> bool:
        is_test = env_i in test_envs
        return any(t == "all" or t == kind or t == name or (t == "test" and is_test)
                   or (t == "train" and not is_test) for t in tokens)

    return [s for s in named_splits if kept(*s[:3])]
