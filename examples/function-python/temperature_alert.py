"""The tutorial's temperature-alert as a Sluice function: keep each sensor's
last reading ("id,epochSeconds,temperature", records keyed by sensor id) and
emit {"id":...,"last":...,"current":...} when a reading differs from the last
one by SLUICE_ALERT_THRESHOLD (default 10) or more; the first reading of a
sensor only sets its state (docs/jobs.md). A reading that does not parse
goes to the dead-letter topic on its own (res.fail)."""

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "function", "python"))
import sluice_function as sf  # noqa: E402

THRESHOLD = float(os.environ.get("SLUICE_ALERT_THRESHOLD", "10"))


def number(f):
    """A float as Go's encoding/json writes it (30, not 30.0)."""
    return str(int(f)) if f == int(f) and abs(f) < 1e21 else repr(f)


def alert(call):
    res = sf.Result()
    last = call.states.get("last-temperature")
    last = float(last) if last else None
    changed = False
    for i, ev in enumerate(call.events):
        try:
            fields = ev.value.decode().split(",")
            sensor, temp = fields[0].strip(), float(fields[2])
            if len(fields) != 3 or not sensor or not math.isfinite(temp):
                raise ValueError
        except (ValueError, IndexError):  # UnicodeDecodeError is a ValueError
            res.fail(i, "reading %r: want id,epochSeconds,temperature" % ev.value[:64])
            continue
        if last is not None and abs(temp - last) >= THRESHOLD:
            out = '{"id":%s,"last":%s,"current":%s}' % (json.dumps(sensor), number(last), number(temp))
            res.emit(sensor.encode(), out.encode())
        last, changed = temp, True
    if changed:
        res.set("last-temperature", repr(last).encode())
    return res


if __name__ == "__main__":
    sf.serve(alert, states=[sf.State("last-temperature")])
