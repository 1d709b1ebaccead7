"""The actor tasks a learner knows: which said hello (how many times), and who waits for room.

Room goes to the actor that began waiting first among those still asking: answered by who asks
first, an actor that asks less often (it pauses longer after a long wait) lost most races,
waited longer still, and sent unrolls that sat acting-to-learning for many batches.
"""

from __future__ import annotations

import threading
import time

import numpy as np

# An actor that has not asked for room for this long has stopped waiting (it sent, died or
# restarted): room no longer waits for it. Longer than an actor's longest pause between asks.
ROOM_ASKING_SECS = 1.0
# The most actor tasks a learner keeps track of, so that no caller makes its bookkeeping
# stall it.
MAX_ACTOR_TASKS = 1 << 16


class Roster:
    """Welcomes and waits for room, by actor task; safe from several server threads at once."""

    def __init__(self):
        self._lock = threading.Lock()
        # Welcomes per actor task: more than one is an actor that came back (restarted, or
        # reconnected after losing this learner).
        self._welcomes: dict[int, int] = {}
        # Actor task -> [when its wait for room began, when it last asked], while it waits.
        self._room_asks: dict[int, tuple[float, float]] = {}

    def welcome(self, actor_task: int) -> str:
        """Records that `actor_task` connected: '' if it may, else the reason it may not."""
        with self._lock:
            if actor_task not in self._welcomes and len(self._welcomes) >= MAX_ACTOR_TASKS:
                return f"this learner serves {MAX_ACTOR_TASKS} actor tasks already"
            self._welcomes[actor_task] = self._welcomes.get(actor_task, 0) + 1
        return ""

    def connections(self) -> dict[int, int]:
        """How many times each actor task has connected."""
        with self._lock:
            return dict(self._welcomes)

    def first_in_line(self, actor_task: int) -> bool:
        """Records that `actor_task` asks for room; whether no actor still asking has waited
        longer (the store's room is the caller's to check).

        Served, the actor keeps its place until its unroll arrives (`stop_waiting`) or it stops
        asking: another actor given the same room in between would send its megabytes only to
        meet a full store, or take the room from the actor that waited.
        """
        now = time.monotonic()
        with self._lock:
            began, last_asked = self._room_asks.get(actor_task, (-np.inf, -np.inf))
            if last_asked < now - ROOM_ASKING_SECS:
                began = now
            self._room_asks = {
                task: asked
                for task, asked in self._room_asks.items()
                if asked[1] >= now - ROOM_ASKING_SECS
            }
            if actor_task in self._welcomes or len(self._room_asks) < MAX_ACTOR_TASKS:
                self._room_asks[actor_task] = (began, now)
            return began <= min(asked[0] for asked in self._room_asks.values())

    def stop_waiting(self, actor_task: int) -> bool:
        """Ends the wait for room of `actor_task`, whose unroll arrived; whether it said hello."""
        with self._lock:
            self._room_asks.pop(actor_task, None)
            return actor_task in self._welcomes
