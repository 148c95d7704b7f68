"""Maps a memfd privately and closes it at import: the mapping names the
memfd; the template must be refused."""
import mmap
import os

_fd = os.memfd_create("channel")
os.ftruncate(_fd, 4096)
SHARED = mmap.mmap(_fd, 4096, flags=mmap.MAP_PRIVATE)
os.close(_fd)


def run():
    return {}
