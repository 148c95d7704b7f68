"""Every child skips loading the call's seccomp filter (PR_SET_SECCOMP)."""
import _skip

_skip.skip(prctl_ops={22})


def run():
    return {"ran": True}
