# Imported by site.py at every interpreter start-up that has this
# package's site dir on sys.path. Before issue 18 that included the
# worker's own importability check, on the host, as root.
import builtins

import str_evidence

builtins.STR_SITECUSTOMIZE = str_evidence.gather("sitecustomize")
