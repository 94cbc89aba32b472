"""Phrasings the commands share, each defined once."""


def help_description(doc: str) -> str:
    """A command's --help description: its module docstring's first paragraph, which argparse rewraps (the
    paragraph's first line alone can stop mid-sentence)."""
    return doc.strip().split("\n\n")[0]


def epochs(n) -> str:
    """'1 epoch', '10 epochs': a count of epochs as a run's log and the tables' legends print it."""
    return f"{n} epoch{'' if str(n) == '1' else 's'}"
