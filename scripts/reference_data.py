"""Regenerate the reference data in tests/data from its public sources.

    cd tests/data
    python ../../scripts/reference_data.py golden     --domainbed PATH --output domainbed_golden
    python ../../scripts/reference_data.py zoo        --domainbed PATH --output domainbed_golden
    python ../../scripts/reference_data.py test_sweep --domainbed PATH --output domainbed_test_sweep
    python ../../scripts/reference_data.py published  --domainbed PATH --output domainbed_published
    python ../../scripts/reference_data.py aotl       --viz PATH       --output aotl_reference

PATH for --domainbed is a tree of facebookresearch/DomainBed at commit
b93c22a1cfc3b2428398272c1a116c8de1f4139e (`git archive <commit> | tar -x -C PATH`); `golden`
and `zoo` import and run its code (Fishr needs backpack-for-pytorch==1.7.1 installed for the
run; it is not a dependency of this project). PATH for --viz is a tree of
olawalesalaudeen/misspecified_DG_benchmarks_viz. Each folder's README says what the files are.
"""
import argparse
import shutil
import subprocess
import sys
from pathlib import Path

AOTL_DATASETS = ["CivilComments", "ColoredMNIST", "PACS", "SpawriousM2M_easy",
                 "SpawriousM2M_hard", "SpawriousO2O_easy", "SpawriousO2O_hard", "TerraIncognita"]


def fail(message):
    sys.exit(f"error: {message}")


def check_commit(tree, expected):
    """A git checkout must be at the pinned commit; an exported tree is taken as it is."""
    if not (tree / ".git").exists():
        return
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    if head != expected:
        fail(f"{tree} is at {head or 'an unknown commit'}, not {expected}")


def import_domainbed(tree):
    """Make DomainBed's own `domainbed` package (not this project's) the one imported."""
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(tree)]
    import domainbed
    if Path(domainbed.__file__).resolve().parent != (tree / "domainbed").resolve():
        fail(f"imported domainbed from {domainbed.__file__}, not from {tree}")


def copy_file(source, target):
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def write_json(document, target):
    from reference_golden import dumps
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(dumps(document))


def make_golden(args):
    import_domainbed(args.domainbed)
    from reference_golden import golden_six
    write_json(golden_six(), args.output / "golden.json")
    copy_file(args.domainbed / "LICENSE", args.output / "LICENSE")


def make_zoo(args):
    import_domainbed(args.domainbed)
    from reference_golden import golden_zoo
    write_json(golden_zoo(args.algorithms), args.output / "golden_zoo.json")
    copy_file(args.domainbed / "LICENSE", args.output / "LICENSE")


def make_test_sweep(args):
    misc = args.domainbed / "domainbed" / "misc"
    target = args.output / "test_sweep_data"
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(misc / "test_sweep_data", target)
    copy_file(misc / "test_sweep_results.txt", args.output / "test_sweep_results.txt")
    copy_file(args.domainbed / "LICENSE", args.output / "LICENSE")


def make_published(args):
    results = args.domainbed / "domainbed" / "results" / "2020_10_06_7df6f06" / "results.tex"
    copy_file(results, args.output / "results.tex")
    copy_file(args.domainbed / "LICENSE", args.output / "LICENSE")


def make_aotl(args):
    """Each CSV compressed by `gzip -9 -n` (no name or time stored: the bytes depend on the
    content only; Python's zlib gives the same content in different bytes)."""
    if shutil.which("gzip") is None:
        fail("the gzip command is needed (gzip -9 -n)")
    for dataset in args.datasets:
        csvs = sorted((args.viz / "data" / dataset).glob("env*_out_acc.csv"))
        if not csvs:
            fail(f"no env*_out_acc.csv under {args.viz / 'data' / dataset}")
        for csv in csvs:
            target = args.output / dataset / (csv.name + ".gz")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(subprocess.run(["gzip", "-9", "-n", "-c", str(csv)],
                                              capture_output=True, check=True).stdout)
    copy_file(args.viz / "LICENSE", args.output / "LICENSE")


def existing_dir(text):
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path


def parser():
    top = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    kinds = top.add_subparsers(dest="kind", required=True)
    makers = {"golden": make_golden, "zoo": make_zoo, "test_sweep": make_test_sweep,
              "published": make_published, "aotl": make_aotl}
    for kind, maker in makers.items():
        sub = kinds.add_parser(kind)
        sub.set_defaults(make=maker)
        if kind == "aotl":
            sub.add_argument("--viz", type=existing_dir, required=True,
                             help="a tree of olawalesalaudeen/misspecified_DG_benchmarks_viz")
            sub.add_argument("--datasets", nargs="+", default=AOTL_DATASETS)
        else:
            sub.add_argument("--domainbed", type=existing_dir, required=True,
                             help="a tree of facebookresearch/DomainBed at the pinned commit")
        if kind == "zoo":
            sub.add_argument("--algorithms", nargs="+", default=None,
                             help="only these (default: every name in DomainBed's ALGORITHMS)")
        sub.add_argument("--output", type=Path, required=True)
    return top


def main(argv=None):
    args = parser().parse_args(argv)
    if getattr(args, "domainbed", None) is not None:
        from reference_golden import DOMAINBED_COMMIT
        check_commit(args.domainbed, DOMAINBED_COMMIT)
    args.make(args)


if __name__ == "__main__":
    main()
