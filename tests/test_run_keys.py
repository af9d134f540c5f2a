"""The key texts a worker process sends back for a run (domainbed.results.run_keys.key_texts)
are the JSON that json writes of each key value, whatever the values' types."""
import json

import pytest

from domainbed.results.grouping import DATA_KEYS
from domainbed.results.run_keys import key_texts

ARGS = {"dataset": "VLCS", "algorithm": "ERM", "trial_seed": 2, "hparams_seed": 7,
        "test_envs": [0, 3], "env_names": None}
HPARAMS = {"lr": 1e-05, "batch_size": 32, "nonlinear": False, "name": "caf\u00e9"}


def _expected(args, hparams):
    """What json writes of each key value (the grouping helpers' keys)."""
    get = args.get
    return (json.dumps(get("dataset")), json.dumps(get("algorithm")),
            json.dumps(get("trial_seed")), json.dumps(get("hparams_seed")),
            json.dumps(get("test_envs")), json.dumps(get("env_names")),
            json.dumps([get(k) for k in DATA_KEYS], default=repr),
            json.dumps([str(get("hparams_seed")),
                        json.dumps(hparams, sort_keys=True, default=str)]))


@pytest.mark.parametrize("change", [
    {}, {"dataset": "caf\u00e9 \"x\"\n"}, {"algorithm": "\ud800"}, {"trial_seed": -3},
    {"hparams_seed": None}, {"hparams_seed": 2 ** 70}, {"test_envs": []},
    {"test_envs": [True, 1]}, {"test_envs": [1.0]}, {"test_envs": [2 ** 64, -1]},
    {"env_names": ["a", "b\u00e9"]}, {"trial_seed": 1.5}, {"trial_seed": True},
    {"dataset": None}, {"data_source": "x", "data_seed": 3.5},
    {"holdout_fraction": float("nan")}, {"test_envs": [[1]]}])
def test_key_texts_are_the_json_of_each_key_value(change):
    args = dict(ARGS, **change)
    hparams_text = json.dumps(HPARAMS).encode()
    texts = key_texts(args, HPARAMS, hparams_text)
    assert texts == _expected(args, HPARAMS)
    assert key_texts(args, HPARAMS, hparams_text) == texts     # (the cached sorted dump)
    assert key_texts(args, HPARAMS) == texts
