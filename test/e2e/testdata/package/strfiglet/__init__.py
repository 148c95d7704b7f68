"""A tiny stand-in for pyfiglet (the reference's package example): the
e2e test builds it into a wheel, str-figlet 1.0, at run time."""

__version__ = "1.0"


def figlet_format(text):
    bar = "+" + "-" * (len(text) + 2) + "+"
    return "\n".join([bar, "| " + text + " |", bar])
