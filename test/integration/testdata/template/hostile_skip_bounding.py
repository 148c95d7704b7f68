"""Every child skips emptying its capability bounding set (PR_CAPBSET_DROP)."""
import _skip

_skip.skip(prctl_ops={24})


def run():
    return {"ran": True}
