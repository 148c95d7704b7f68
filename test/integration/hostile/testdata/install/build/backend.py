# An in-tree PEP 517 build backend: its build_wheel is the build hook
# pip runs when it builds this sdist. It runs only when the operator opted
# in to builds, and then only inside the installation sandbox: it gathers
# evidence of where it ran and bakes it into the wheel it builds.
import base64
import hashlib
import json
import os
import zipfile

import str_evidence

NAME, VERSION = "str_evil_build", "1.0"


def _dist_info():
    return NAME + "-" + VERSION + ".dist-info"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    ev = str_evidence.gather("build_hook")
    files = {
        "strbuilt.py": "BUILT = " + repr(json.dumps(ev)) + "\n",
        _dist_info() + "/METADATA": "Metadata-Version: 2.1\nName: str-evil-build\nVersion: " + VERSION + "\n",
        _dist_info() + "/WHEEL": "Wheel-Version: 1.0\nGenerator: str-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for n, c in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(c.encode()).digest()).rstrip(b"=").decode()
        record += "%s,sha256=%s,%d\n" % (n, h, len(c))
    files[_dist_info() + "/RECORD"] = record + _dist_info() + "/RECORD,,\n"
    name = NAME + "-" + VERSION + "-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as z:
        for n, c in files.items():
            z.writestr(n, c)
    return name
