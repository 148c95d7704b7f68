"""A tool run in a per-tool template with a network policy: each call
tries the connections it is given, through its own egress listeners on
its own lo, and reports what it got and what its environment says."""
import os
import socket
import time


def _line(s):
    s.settimeout(10)
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(100)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()


def _connect_proxy(target):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        c = s.recv(1)
        if not c:
            break
        head += c
    status = head.split(b"\r\n")[0].decode()
    if " 200 " not in status + " ":
        return "denied: " + status
    return "ok: " + _line(s)


def _plain(host, port):
    addr = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)[0][4]
    return "ok: " + _line(socket.create_connection(addr, timeout=10))


def probe(probes, hold=0):
    out = {"env": {k: os.environ.get(k, "") for k in ("HTTPS_PROXY", "STR_NETWORK")}}
    for name, kind, host, port in probes:
        try:
            if kind == "proxy":
                out[name] = _connect_proxy("%s:%d" % (host, port))
            else:
                out[name] = _plain(host, port)
        except Exception as e:  # noqa: BLE001 - the probe reports any failure
            out[name] = "err: %s" % e
    time.sleep(hold)
    return out
