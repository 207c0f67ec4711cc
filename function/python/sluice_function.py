"""Sluice sidecar SDK for Python: the standard library only.

A function is called with one key's events and current states and returns a
Result; Sluice keeps the state, fires the timers and commits exactly once.
The protocol is docs/sidecar.md: Connect's unary protocol with JSON bodies,
POST /sluice.function.v1.FunctionService/{Describe,Invoke}.

    import sluice_function as sf

    def handle(call):                 # a sf.Call
        n = int(call.states.get("count", b"0"))
        res = sf.Result()
        for ev in call.events:        # records (and timers) in order
            n += 1
            res.emit(ev.key, str(n).encode())
        res.set("count", str(n).encode())
        return res

    sf.serve(handle, states=[sf.State("count")], address="127.0.0.1:8080")

address is host:port or unix:/path/to/socket.
"""

import base64
import json
import os
import socket
import socketserver
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PROTOCOL_VERSION = 1
SERVICE = "/sluice.function.v1.FunctionService/"


class State:
    """A declared state: a name and a TTL in milliseconds (0: never)."""

    def __init__(self, name, ttl_ms=0):
        self.name, self.ttl_ms = name, ttl_ms


class EventTimeSource:
    """Where a record's event time is, for a function in event time: a
    field of its JSON value named by a JSON Pointer (RFC 6901, "/ts"), or
    a header; format is "UNIX_MILLIS" (an integer), "UNIX_SECONDS" (a
    number, a fraction allowed) or "RFC3339" (text). The processor reads
    it before each call; a record without one is dead-lettered."""

    FORMATS = ("UNIX_MILLIS", "UNIX_SECONDS", "RFC3339")

    def __init__(self, json_pointer=None, header=None, format="UNIX_MILLIS"):
        if (json_pointer is None) == (header is None):
            raise ValueError("EventTimeSource: give json_pointer or header, one of them")
        if format not in self.FORMATS:
            raise ValueError("EventTimeSource: format %r: want one of %s" % (format, ", ".join(self.FORMATS)))
        self.json_pointer, self.header, self.format = json_pointer, header, format

    def to_json(self):
        d = {"format": self.format}
        if self.json_pointer is not None:
            d["jsonPointer"] = self.json_pointer
        else:
            d["header"] = self.header
        return d


class Event:
    """A record (timer_at_ms is None) or a fired timer (is_event_timer says
    its domain: event time, or processing time)."""

    def __init__(self, d):
        r = d.get("record")
        self.timer_at_ms, self.is_event_timer = None, False
        if r is None:
            t = d.get("timer", {})
            self.timer_at_ms = int(t.get("atMs", 0))
            self.is_event_timer = t.get("domain") in ("EVENT_TIME", 1)
            r = {}
        self.topic = r.get("topic", "")
        self.partition = int(r.get("partition", 0))
        self.offset = int(r.get("offset", 0))
        self.timestamp_ms = int(r.get("timestampMs", 0))
        # The event time the processor read where event_time_source says;
        # None without one (the event time is then timestamp_ms).
        et = r.get("eventTimeMs")
        self.event_time_ms = int(et) if et is not None else None
        self.key = _b(r.get("key"))
        self.value = _b(r.get("value"))
        self.headers = [(h.get("key", ""), _b(h.get("value"))) for h in r.get("headers", [])]

    @property
    def is_timer(self):
        return self.timer_at_ms is not None


class Call:
    """One key's events: key, states (name -> bytes, unset ones absent),
    events (oldest first), task, now_ms (the processor's clock) and, for a
    function in event time, watermark_ms (the task's watermark; None
    before it has one)."""

    def __init__(self, d, task, now_ms, watermark_ms=None):
        self.key = _b(d.get("key"))
        self.states = {s["name"]: _b(s.get("value")) for s in d.get("states", [])}
        self.events = [Event(e) for e in d.get("events", [])]
        self.task, self.now_ms, self.watermark_ms = task, now_ms, watermark_ms


class Result:
    """What to do for the key: state changes, outputs, timers, a status."""

    def __init__(self):
        self.status, self.reason = "OK", ""
        self._states, self._outputs, self._timers = {}, [], []
        self._failed = []

    def set(self, name, value):
        self._states[name] = value

    def delete(self, name):
        self._states[name] = None

    def emit(self, key, value, headers=(), tag="", timestamp_ms=None):
        """Produce a record: to the output topic, or to a side output tag.

        timestamp_ms sets its Kafka timestamp (unix milliseconds); None
        stamps it with the time of what the call answers: the event time
        (the Kafka time, or what event_time_source reads) of the key's
        last record in the batch that the result does not fail, or the
        timer's."""
        self._outputs.append((key, value, list(headers), tag, timestamp_ms))

    def set_timer(self, at_ms):
        """Set a processing-time timer of the key."""
        self._timers.append((int(at_ms), False, False))

    def delete_timer(self, at_ms):
        self._timers.append((int(at_ms), True, False))

    def set_event_timer(self, at_ms):
        """Set an event-time timer of the key (a function in event time):
        it fires once the task's watermark reaches at_ms."""
        self._timers.append((int(at_ms), False, True))

    def delete_event_timer(self, at_ms):
        self._timers.append((int(at_ms), True, True))

    def retry(self, reason=""):
        self.status, self.reason = "RETRY", reason
        return self

    def dead_letter(self, reason):
        self.status, self.reason = "DEAD_LETTER", reason
        return self

    def fail(self, index, reason):
        """Send one event of the call, call.events[index], to the
        dead-letter topic with reason, and let the rest of the result
        apply: it is then the key's state and outputs as of the other
        events. Fail each event at most once; a result that fails every
        event must set no state, emit nothing and set no timer. After
        dead_letter or retry it does nothing. (A processor that predates
        it dead-letters all the key's events of the call instead.)"""
        if self.status in ("DEAD_LETTER", "RETRY"):
            return self  # the whole key's fate is set already
        self.status = "PARTIAL"
        self._failed.append({"index": int(index), "reason": reason})
        return self

    def to_json(self, key):
        # PARTIAL as its number: a processor that predates it reads an
        # unknown name as OK, and an unknown number as a failed key.
        out = {"key": _e(key), "status": 3 if self.status == "PARTIAL" else self.status}
        if self.reason:
            out["reason"] = self.reason
        if self.status not in ("OK", "PARTIAL"):
            return out
        if self._failed:
            out["failedEvents"] = self._failed
        out["states"] = [{"name": n, "delete": True} if v is None else {"name": n, "value": _e(v)}
                         for n, v in self._states.items()]
        out["outputs"] = []
        for k, v, hs, t, ts in self._outputs:
            o = {"key": _e(k), "value": _e(v), "tag": t,
                 "headers": [{"key": hk, "value": _e(hv)} for hk, hv in hs]}
            if ts is not None:
                o["timestampMs"] = str(int(ts))
            out["outputs"].append(o)
        out["timers"] = [{"atMs": str(at), "delete": d, "domain": "EVENT_TIME" if ev else "PROCESSING_TIME"}
                         for at, d, ev in self._timers]
        return out


def _b(s):
    return base64.b64decode(s) if s else b""


def _e(b):
    if isinstance(b, str):
        b = b.encode()
    return base64.b64encode(b or b"").decode("ascii")


def _handler(fn, states, side_outputs, event_time=False, event_time_source=None):
    describe = {"protocolVersion": PROTOCOL_VERSION,
                "states": [{"name": s.name, "ttlMs": str(s.ttl_ms)} for s in states],
                "sideOutputs": list(side_outputs),
                "eventTime": bool(event_time)}
    if event_time_source is not None:
        if not event_time:
            raise ValueError("event_time_source needs event_time=True")
        describe["eventTimeSource"] = event_time_source.to_json()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: one connection per caller

        def log_message(self, *args):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path == SERVICE + "Describe":
                features = json.loads(body or b"{}").get("features", [])
                if event_time and "event_time" not in features:
                    # Connect's error for FAILED_PRECONDITION: the
                    # processor reports it and stops, rather than run an
                    # event-time function without event time.
                    return self._reply(400, {"code": "failed_precondition", "message":
                                             "this function works in event time, which the processor "
                                             "does not support: upgrade the processor"})
                if event_time_source is not None and "event_time_source" not in features:
                    return self._reply(400, {"code": "failed_precondition", "message":
                                             "this function says where its records' event time is, which "
                                             "the processor does not support: upgrade the processor"})
                return self._reply(200, describe)
            if self.path != SERVICE + "Invoke":
                return self._reply(404, {"code": "unimplemented", "message": self.path})
            try:
                req = json.loads(body or b"{}")
                task, now = int(req.get("task", 0)), int(req.get("nowMs", 0))
                wm = req.get("watermarkMs")
                wm = int(wm) if wm is not None else None
                results = []
                for k in req.get("keys", []):
                    call = Call(k, task, now, wm)
                    results.append(fn(call).to_json(call.key))
            except Exception as e:  # the processor retries, then dead-letters
                return self._reply(500, {"code": "internal", "message": repr(e)})
            self._reply(200, {"results": results})

        def _reply(self, status, obj):
            b = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(b)))
            self.end_headers()
            self.wfile.write(b)

    return Handler


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self):
        conn, _ = super().get_request()
        return conn, ("unix", 0)  # http.server wants a (host, port)


def serve(fn, states=(), side_outputs=(), address=None, event_time=False, event_time_source=None):
    """Serve fn until the process ends. address defaults to
    $FUNCTION_LISTEN, then 127.0.0.1:8080. event_time=True declares the
    function in event time (watermarks in calls, event-time timers), its
    event time the records' Kafka timestamps, or what event_time_source
    (an EventTimeSource) says."""
    address = address or os.environ.get("FUNCTION_LISTEN", "127.0.0.1:8080")
    handler = _handler(fn, states, side_outputs, event_time, event_time_source)
    if address.startswith("unix:"):
        path = address[len("unix:"):]
        if os.path.exists(path):
            os.unlink(path)
        srv = _UnixServer(path, handler)
    else:
        host, _, port = address.rpartition(":")
        srv = ThreadingHTTPServer((host, int(port)), handler)
        srv.daemon_threads = True
    print("sluice function listening on", address, flush=True, file=sys.stderr)
    srv.serve_forever()
