"""``python -m ckptbench.processes.point_process REQUEST.json``: run one point in this process (``--isolate``)."""

from __future__ import annotations

import sys

from ckptbench.processes.isolate import child_main

if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
