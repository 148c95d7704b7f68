"""Starts a thread at import: a template must be refused (a fork copies
one thread; a lock another held stays locked in every child)."""
import threading
import time

threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()


def run():
    return {}
