"""Test function: event time through the Python SDK. Each record sets an
event-time timer 10 s after its Kafka time and reports the call's
watermark; a timer reports its time, its domain and the watermark."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sluice_function as sf  # noqa: E402


def handle(call):
    res = sf.Result()
    for ev in call.events:
        if ev.is_timer:
            res.emit(call.key, b"fired %d event=%s wm=%s" % (ev.timer_at_ms, str(ev.is_event_timer).encode(), str(call.watermark_ms).encode()))
            continue
        res.emit(call.key, b"seen wm=%s" % str(call.watermark_ms).encode())
        res.set_event_timer(ev.timestamp_ms + 10000)
    return res


if __name__ == "__main__":
    sf.serve(handle, event_time=True)
