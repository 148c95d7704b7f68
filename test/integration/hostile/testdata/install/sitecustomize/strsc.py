def evidence():
    import builtins
    return getattr(builtins, "STR_SITECUSTOMIZE", None)
