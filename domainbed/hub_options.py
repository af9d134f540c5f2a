"""The ``hf:`` dataset name and its options (cheap to import: no torch, no ``datasets``).

A Hugging Face dataset is named ``hf:REPO_OR_DIR``; what the ``--hf_*`` flags choose is part
of the name, as a query string (``hf:flwrlabs/pacs?domain_column=region&revision=abc``), so
that every command that resolves a dataset by its name (train, sweep, evaluate, the
results tables) builds the same environments, and runs made with other columns or another
revision never pool with these. The flags are the way to write it:
``--dataset hf:DIR --hf_domain_column region`` is ``--dataset hf:DIR?domain_column=region``.
"""
from typing import Any
from urllib.parse import parse_qsl, urlencode

from oodutils.errors import UserError

# option (in the name) -> (flag, help)
HF_OPTIONS = {
    "domain_column": ("--hf_domain_column", "hf: datasets: the column whose values are the "
                                            "environments (default domain)"),
    "label_column": ("--hf_label_column", "hf: datasets: the class column (default label; "
                                          "classes follow its ClassLabel names)"),
    "text_column": ("--hf_text_column", "hf: datasets: the text column of a text dataset "
                                        "(default: none, the image column is read)"),
    "revision": ("--hf_revision", "hf: datasets: the Hub commit, tag or branch to read "
                                  "(default main; the commit used goes into the records)"),
    "split": ("--hf_split", "hf: datasets: the split to read (default train)"),
    "domains": ("--hf_domains", "hf: datasets: the environments, in this order, as a "
                                "comma-separated list of domain values (default: every "
                                "value, sorted)"),
}
DEFAULTS = {"domain_column": "domain", "label_column": "label", "text_column": None,
            "revision": None, "split": "train", "domains": None}


def split_name(name: str) -> tuple[str, dict[str, Any]]:
    """``hf:SOURCE?k=v&...`` -> (SOURCE, {option: value}) with the defaults filled in."""
    source, _, query = name.partition("?")
    options = dict(DEFAULTS)
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key not in HF_OPTIONS:
            raise UserError(f"hf:{name}: unknown option {key!r} in the dataset name; valid: "
                            f"{', '.join(HF_OPTIONS)}")
        options[key] = value
    return source, options


def join_name(source: Any, options: Any) -> Any:
    """The canonical ``hf:`` name: SOURCE and the options that differ from the defaults,
    in HF_OPTIONS order."""
    changed = [(k, options[k]) for k in HF_OPTIONS
               if options.get(k) not in (None, DEFAULTS[k])]
    return f"hf:{source}" + (f"?{urlencode(changed, safe=',/')}" if changed else "")


def add_hf_flags(parser: Any, add_option: Any) -> None:
    """The --hf_* flags (default None: not given) on `parser`."""
    for option, (flag, help_text) in HF_OPTIONS.items():
        add_option(parser, flag, dest=f"hf_{option}", type=str, default=None,
                   help=help_text)


def fold_hf_flags(dataset: Any, values: Any) -> Any:
    """`dataset` with the given --hf_* flags (`values`: name -> value, None when not given)
    folded into its name; a flag with a dataset that is not ``hf:`` is an error."""
    given = {k: values.get(f"hf_{k}") for k in HF_OPTIONS
             if values.get(f"hf_{k}") is not None}
    if not given:
        return dataset
    if not str(dataset).startswith("hf:"):
        flags = ", ".join(HF_OPTIONS[k][0] for k in given)
        raise UserError(f"{flags} only apply to hf: datasets (--dataset hf:REPO_OR_DIR), "
                        f"not to {dataset!r}")
    source, options = split_name(dataset[len("hf:"):])
    for key, value in given.items():
        named = options[key]
        if named not in (None, DEFAULTS[key]) and named != value:
            raise UserError(f"{HF_OPTIONS[key][0]} {value!r} contradicts {key}={named!r} "
                            f"in the dataset name {dataset!r}; give one of them")
        options[key] = value
    return join_name(source, options)
