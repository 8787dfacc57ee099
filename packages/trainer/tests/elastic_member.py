"""A member of an elastic group for ``test_elastic.py``: ``python elastic_member.py ROOT ROLE``.

``leader``: opens the group, admits ``trainer-1`` once it has announced itself, then broadcasts a
large payload that trainer-1 never receives, and prints how the wait ended (``ENDED <seconds>
<error>``). ``follower``: joins, takes the leader's state, prints ``JOINED``, then sleeps without
taking part in anything (alive, so gloo would wait for its timeout).
"""

from __future__ import annotations

import os
import sys
import time

from relayrl.trainer import elastic


def main(root: str, role: str) -> None:
    if role == "follower":
        ranks = elastic.ElasticRanks(root, "trainer-1", leader=False)
        ranks.wait_for_leader()
        ranks.set_state = lambda state: print("JOINED", state["step"], flush=True)
        ranks.join()
        time.sleep(300)
        return
    ranks = elastic.ElasticRanks(root, "trainer", leader=True)
    ranks.get_state = lambda: {"step": 7}
    ranks.open()
    view = None
    while view is None:
        time.sleep(0.1)
        view = ranks.newcomers()
    ranks.grow(view)
    print("FORMED", ranks.world, flush=True)
    started = time.monotonic()
    try:
        ranks.broadcast(b"x" * (8 << 20))
        print("ENDED", time.monotonic() - started, "completed", flush=True)
    except RuntimeError as error:
        print("ENDED", round(time.monotonic() - started, 2), error, flush=True)
    os._exit(0)  # the group given up on still waits in gloo


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
