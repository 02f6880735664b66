"""Node lines that xl's own typed messages never make, for the tests of what node 0 refuses.

A node's supervisor sends only the values of xl.launcher.multinode.protocol; a peer that is not
xl (or a broken one) can send any line. ``forge`` puts such a line on a real link, below the
typed messages, as the JSON the wire carries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from xl.launcher.multinode.nodelink import NodeLink


def forge(link: NodeLink, obj: Mapping[str, object]) -> None:
    """``obj`` to node 0 as the body line it is, unchecked by this side."""
    link.send_line(json.dumps(obj, separators=(",", ":")).encode())
