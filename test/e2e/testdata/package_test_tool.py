"""The reference's package-loading example, with our own package: the
manifest declares `package: str-figlet`, whose module (strfiglet) is not
this tool's module; the worker installs it at start-up."""


def render_ascii_art(ctx, text):
    import strfiglet

    ctx.send_status("Rendering %r..." % text)
    return {"art": strfiglet.figlet_format(text), "package_version": strfiglet.__version__, "from": strfiglet.__file__}
