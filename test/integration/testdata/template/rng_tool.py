"""A tool that imports random generators at import time, as a tool using
numpy would: each call reports what the shared generators give next. A
template's calls are copies of one process, so without a reseed in each
call they would all give the same numbers."""
import random

import numpy.random


def draw():
    return {"random": random.getrandbits(62), "numpy": int(numpy.random.randint(0, 1 << 62, dtype="int64"))}
