"""`python -m hdqt_cil.results RUN_ROOT [RUN_ROOT ...] --out DIR`: aggregate run folders into tables. A root may be
a tar archive of run folders (results/*/runs.tgz), or one folder of one
(results/cifar10/runs.tgz:runs/cifar10-resnet32/icarl), read from a temporary copy."""
import argparse
import sys
from pathlib import Path

from .tables import ROOTS_HELP, make_tables, readable_roots, to_markdown


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("roots", nargs="+", help=ROOTS_HELP)
    parser.add_argument("--out", required=True, help="where table.md/.csv/.tex and accuracy.png are written; "
                        "the files an earlier run wrote there (make_tables_outputs.txt) and this one does not are "
                        "removed")
    parser.add_argument("--no-plot", action="store_true", help="draw no figures; those an earlier run drew in --out "
                        "that these runs would draw again stay")
    parser.add_argument("--published", metavar="CSV", help="published numbers to set beside the runs' "
                        "(columns benchmark, strategy, quant, avg_acc, last_acc, source): published.md")
    args = parser.parse_args(argv)
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"error: --out {args.out} is a file; name a folder for the tables", file=sys.stderr)
        sys.exit(2)
    try:
        with readable_roots(args.roots) as roots:
            table = make_tables(roots, args.out, plot=not args.no_plot, published=args.published)
    except (FileNotFoundError, ValueError) as error:  # no run folders, two runs of a seed, a CSV that does not fit
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    print(to_markdown(table))


if __name__ == "__main__":
    main()
