"""Tools of the installation cases: each reports what its package's
payload recorded, or which module it imported."""
import json


def sitecustomize(ctx):
    import strsc
    return {"evidence": strsc.evidence()}


def pth(ctx):
    import strpth
    return {"evidence": strpth.evidence()}


def built(ctx):
    import strbuilt
    return {"evidence": json.loads(strbuilt.BUILT)}


def which(ctx):
    import victimmod
    return {"who": victimmod.WHO}
