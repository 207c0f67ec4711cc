"""Test function: temperature-split through the Python SDK, with headers kept,
plus a processing-time timer per sensor that reports how many readings it saw
one minute after its first, stamped 5 ms after the timer (exercises side
outputs, headers, timers, deletes and output timestamps)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sluice_function as sf  # noqa: E402


def handle(call):
    res = sf.Result()
    seen = int(call.states.get("seen", b"0") or b"0")
    for ev in call.events:
        if ev.is_timer:
            # Stamped 5 ms after the timer, to test timestamp_ms.
            res.emit(call.key, b"seen:%d" % seen, headers=[("timer-at", str(ev.timer_at_ms).encode())],
                     timestamp_ms=ev.timer_at_ms + 5)
            res.delete("seen")
            return res
        if seen == 0:
            res.set_timer(call.now_ms + 60000)
        seen += 1
        temp = float(ev.value.decode().split(",")[2])
        res.emit(ev.key, ev.value, headers=ev.headers, tag="" if temp >= 30 else "low")
    res.set("seen", str(seen).encode())
    return res


if __name__ == "__main__":
    sf.serve(handle, states=[sf.State("seen")], side_outputs=["low"])
