"""Aggregate run folders into Markdown/CSV/LaTeX tables and an accuracy plot (see hdqt_cil/results)."""
from hdqt_cil.results.__main__ import main

if __name__ == "__main__":
    main()
