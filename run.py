"""`python run.py strategy=icarl quant=hdqt benchmark=hapt`: the `hdqt-cil` command from a checkout (README.md)."""
from hdqt_cil.cli import main

if __name__ == "__main__":
    main()
