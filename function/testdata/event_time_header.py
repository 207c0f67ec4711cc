"""Test function: an event time from a header (RFC 3339) through the
Python SDK. Each record reports the call's watermark and sets an
event-time timer 10 s after its event time, as the processor read it
(event_time_ms); a timer reports its time and the watermark."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import sluice_function as sf  # noqa: E402


def handle(call):
    res = sf.Result()
    for ev in call.events:
        if ev.is_timer:
            res.emit(call.key, b"fired %d wm=%s" % (ev.timer_at_ms, str(call.watermark_ms).encode()))
            continue
        res.emit(call.key, b"seen wm=%s" % str(call.watermark_ms).encode())
        res.set_event_timer(ev.event_time_ms + 10000)
    return res


if __name__ == "__main__":
    sf.serve(handle, event_time=True, event_time_source=sf.EventTimeSource(header="at", format="RFC3339"))
