"""Summarises an input artifact into an output artifact (ctx API)."""


def process_file(input_file: str, ctx=None):
    text = ctx.load_artifact_text("input_file")
    ctx.save_artifact("summary.txt", ("lines: %d\n" % len(text.splitlines())).encode())
    return {"lines": len(text.splitlines())}
