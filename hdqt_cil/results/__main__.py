"""`python -m hdqt_cil.results RUN_ROOT [RUN_ROOT ...] --out DIR`: aggregate run folders into tables."""
import argparse

from .tables import make_tables, to_markdown


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("roots", nargs="+", help="folders searched recursively for run folders (summary.json)")
    parser.add_argument("--out", required=True, help="where table.md/.csv/.tex and accuracy.png are written")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--published", metavar="CSV", help="published numbers to set beside the runs' "
                        "(columns benchmark, strategy, quant, avg_acc, last_acc, source): published.md")
    args = parser.parse_args(argv)
    print(to_markdown(make_tables(args.roots, args.out, plot=not args.no_plot, published=args.published)))


if __name__ == "__main__":
    main()
