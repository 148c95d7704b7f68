# Shared by every hostile package of the installation cases: what a
# payload learns about where it runs, and its attempt to leave a marker
# on the host (at a path of the test's host temp dir, substituted when the
# test builds the package). Inside a sandbox the write lands in the
# sandbox's own /tmp or fails; on the host it would create the marker the
# test checks for.
import errno
import os
import socket

MARKER = "{marker}"
LISTENER = int("{listener}")


def gather(tag):
    ev = {"tag": tag, "hostname": socket.gethostname(), "uid": os.getuid(), "pid": os.getpid()}
    try:
        with open(MARKER, "a") as f:
            f.write(tag + "\n")
        ev["marker_write"] = "written"
    except OSError as e:
        ev["marker_write"] = errno.errorcode.get(e.errno, str(e.errno))
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect(("127.0.0.1", LISTENER))
        ev["listener"] = "connected"
    except OSError as e:
        ev["listener"] = errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__
    finally:
        s.close()
    # Through the sandbox's egress proxy, when it has one: a CONNECT to
    # the host listener must be refused by the network policy.
    proxy = os.environ.get("HTTPS_PROXY", "")
    if proxy.startswith("http://"):
        host, _, port = proxy[len("http://"):].rstrip("/").partition(":")
        p = socket.socket()
        p.settimeout(10)
        try:
            p.connect((host, int(port)))
            p.sendall(("CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n" % (LISTENER, LISTENER)).encode())
            ev["via_proxy"] = p.recv(200).decode("latin-1").split("\r\n")[0]
        except OSError as e:
            ev["via_proxy"] = errno.errorcode.get(e.errno, str(e)) if e.errno else type(e).__name__
        finally:
            p.close()
    return ev
