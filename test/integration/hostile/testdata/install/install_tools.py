"""Tools of the installation cases: each reports what its package's
payload recorded, or which module it imported."""
import json


def sitecustomize(ctx):
    import strsc
    # The runner's interpreter starts with -S: site imported no
    # sitecustomize, so nothing is recorded yet.
    at_start = strsc.evidence()
    # Imported by the tool's own code, the payload runs now, confined.
    import sitecustomize  # noqa: F401
    return {"at_start": at_start, "evidence": strsc.evidence()}


def pth(ctx):
    import strpth
    return {"evidence": strpth.evidence()}


def built(ctx):
    import strbuilt
    return {"evidence": json.loads(strbuilt.BUILT)}


def which(ctx):
    import victimmod
    return {"who": victimmod.WHO}
