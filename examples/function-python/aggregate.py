"""The aggregate job as a Sluice function: count, sum, min and max of the
base-10 integer values per key; for every record, emit the running
aggregation {"count":C,"sum":S,"min":m,"max":M} keyed like the input
(DESIGN section 7). A value that does not parse goes to the dead-letter
topic on its own (res.fail); the others count."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "function", "python"))
import sluice_function as sf  # noqa: E402


def aggregate(call):
    res = sf.Result()
    raw = call.states.get("aggregate")
    a = json.loads(raw) if raw else None
    changed = False
    for i, ev in enumerate(call.events):
        try:
            v = int(ev.value)
        except ValueError:
            res.fail(i, "value %r is not a base-10 integer" % ev.value[:64])
            continue
        if a is None:
            a = {"count": 0, "sum": 0, "min": v, "max": v}
        a["count"] += 1
        a["sum"] += v
        a["min"] = min(a["min"], v)
        a["max"] = max(a["max"], v)
        res.emit(ev.key, json.dumps(a, separators=(",", ":")).encode())
        changed = True
    if changed:
        res.set("aggregate", json.dumps(a, separators=(",", ":")).encode())
    return res


if __name__ == "__main__":
    sf.serve(aggregate, states=[sf.State("aggregate")])
