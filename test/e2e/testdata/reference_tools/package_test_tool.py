"""Needs its declared package (pyfiglet), imported only when called."""


def render_ascii_art(text: str = "str"):
    import pyfiglet

    return {"art": pyfiglet.figlet_format(text)}
