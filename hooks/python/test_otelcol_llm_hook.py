"""Tests of otelcol_llm_hook: run with `python3 -m unittest -v` in this folder.

Two layers: unit tests against an in-process UDP socket and HTTP server, and
end-to-end tests against the built collector (../../bin/otelcol-llm, or the
path in OTELCOL_LLM_BIN). The latter are skipped when the binary is missing,
unless the environment variable CI is set, where they fail instead.
"""

import http.server
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import urllib.request
from unittest import mock
import warnings

import otelcol_llm_hook as hook
from otelcol_llm_hook import Client

HERE = os.path.dirname(os.path.abspath(__file__))

# Keep the client's rate-limited failure warnings out of the test output;
# assertLogs still sees them.
logging.getLogger("otelcol_llm_hook").addHandler(logging.NullHandler())
logging.getLogger("otelcol_llm_hook").propagate = False

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SPAN_ID = "b7ad6b7169203331"
PARENT_SPAN_ID = "00f067aa0ba902b7"
T0 = 1_700_000_000_000_000_000
# The receiver's default hooks::limits, as its answers state them.
RECEIVER_LIMITS = {"max_lines_per_batch": 10000, "max_line_bytes": 16384, "max_request_body_size": 8 << 20}


def wait_for(cond, timeout=5.0, interval=0.01):
    """Poll cond until it returns a truthy value or timeout seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v or time.monotonic() >= deadline:
            return v
        time.sleep(interval)


def free_port(kind=socket.SOCK_STREAM):
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class UDPSink:
    """A loopback UDP socket the tests read datagrams from."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.endpoint = "udp://127.0.0.1:%d" % self.sock.getsockname()[1]
        self.datagrams = []

    def lines(self, want, timeout=5.0):
        """Read datagrams until want lines have arrived or timeout; return all lines."""
        deadline = time.monotonic() + timeout
        while sum(d.count(b"\n") for d in self.datagrams) < want:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self.sock.settimeout(left)
            try:
                self.datagrams.append(self.sock.recv(70000))
            except socket.timeout:
                break
        return [ln.decode("utf-8") for d in self.datagrams for ln in d.split(b"\n") if ln]

    def close(self):
        self.sock.close()


class HTTPSink:
    """A threaded http.server on 127.0.0.1:0 recording requests.

    status/response set the answer, unless answers holds (status, headers,
    response) tuples: request i gets answers[i] while there is one. While
    gate is clear, handlers block (after setting started), which stalls a
    client's sender thread. With limits set ({"max_lines_per_batch": …,
    "max_line_bytes": …, "max_request_body_size": …}), the default answer is
    the receiver's with those limits: 413 for a body over
    max_request_body_size, the lines over max_line_bytes and those after
    the first max_lines_per_batch rejected, the limits stated when the body
    broke one of the two batch limits.
    Request headers are kept as http.client.HTTPMessage: case-insensitive.
    """

    def __init__(self, status=200, response=None):
        sink = self
        self.status = status
        self.response = response
        self.limits = None
        self.answers = []
        self.requests = []  # (path, headers, body)
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                sink.started.set()
                sink.gate.wait(10)
                with sink.lock:
                    i = len(sink.requests)
                    sink.requests.append((self.path, self.headers, body))
                status, headers, payload = sink.status, {}, sink.response
                if i < len(sink.answers):
                    status, headers, payload = sink.answers[i]
                if payload is None:
                    status, payload = sink.answer(status, body)
                data = json.dumps(payload).encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (request_timeout test)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d/v1/token-events" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def answer(self, status, body):
        """The status and answer of a receiver with self.limits to body, of valid lines."""
        lines = body.split(b"\n")[:-1]
        if self.limits is None:
            return status, {"accepted": len(lines), "rejected": 0, "errors": []}
        max_lines, max_line, max_body = (self.limits["max_lines_per_batch"], self.limits["max_line_bytes"],
                                         self.limits["max_request_body_size"])
        if len(body) > max_body:
            return 413, {"accepted": 0, "rejected": 0, "errors": [], "limits": self.limits,
                         "error": "body larger than max_request_body_size (%d bytes)" % max_body}
        rejected = max(len(lines) - max_lines, 0) + sum(len(ln) > max_line for ln in lines[:max_lines])
        r = {"accepted": len(lines) - rejected, "rejected": rejected, "errors": []}
        if len(lines) > max_lines:
            r["errors"].append({"line": max_lines + 1, "message": "batch holds more than %d lines: this line and "
                                "the %d after it not read" % (max_lines, len(lines) - max_lines - 1)})
            r["limits"] = self.limits
        return (200 if r["accepted"] else 400), r

    def bodies(self):
        with self.lock:
            return [r[2] for r in self.requests]

    def lines(self):
        return [ln.decode("utf-8") for b in self.bodies() for ln in b.split(b"\n") if ln]

    def close(self):
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


class ValidationTest(unittest.TestCase):
    def setUp(self):
        self.sink = UDPSink()
        self.client = Client(self.sink.endpoint)

    def tearDown(self):
        self.client.close()
        self.sink.close()

    def test_endpoint_parsing(self):
        p = hook._parse_endpoint
        self.assertEqual(p("udp://collector"), ("udp", ("collector", 4321)))
        self.assertEqual(p("udp://127.0.0.1:9999"), ("udp", ("127.0.0.1", 9999)))
        self.assertEqual(p("udp://[::1]:9999"), ("udp", ("::1", 9999)))
        self.assertEqual(p("http://collector"), ("http", "http://collector:4320/v1/token-events"))
        self.assertEqual(p("http://h:1234/v1/token-events"), ("http", "http://h:1234/v1/token-events"))
        self.assertEqual(p("https://h/custom"), ("http", "https://h:4320/custom"))
        for bad in ("tcp://h:1", "h:4321", "udp://:4321", "http://h:99999", "udp://h:1/path", 42):
            with self.subTest(endpoint=bad), self.assertRaises(ValueError):
                Client(bad)

    def test_default_batch_sizes(self):
        self.assertEqual(self.client._max_batch_bytes, 8 << 10)
        self.assertEqual(self.client._max_batch_lines, 10000)
        with Client("http://127.0.0.1:1") as c:
            self.assertEqual(c._max_batch_bytes, 1 << 20)
            self.assertEqual(c._max_batch_lines, 10000)
        with self.assertRaises(ValueError):
            Client("udp://127.0.0.1:1", max_batch_bytes=70000)

    def test_programmer_errors_raise(self):
        c = self.client
        cases = {
            "trace_id short": lambda: c.start("s", trace_id="abc"),
            "trace_id 31 digits": lambda: c.start("s", trace_id=TRACE_ID[:31]),
            "trace_id not hex": lambda: c.start("s", trace_id="g" * 32),
            "trace_id zeros": lambda: c.start("s", trace_id="0" * 32),
            "trace_id int too big": lambda: c.start("s", trace_id=1 << 128),
            "trace_id bytes": lambda: c.start("s", trace_id=b"x" * 16),
            "span_id long": lambda: c.start("s", span_id=TRACE_ID),
            "parent_span_id zeros": lambda: c.start("s", parent_span_id="0" * 16),
            "operation": lambda: c.start("s", operation="embeddings"),
            "prompt_tokens negative": lambda: c.start("s", prompt_tokens=-1),
            "prompt_tokens bool": lambda: c.start("s", prompt_tokens=True),
            "prompt_tokens float": lambda: c.start("s", prompt_tokens=3.0),
            "model not str": lambda: c.start("s", model=1),
            "attributes not mapping": lambda: c.start("s", attributes=["a"]),
            "attributes value": lambda: c.start("s", attributes={"k": 1}),
            "attributes empty key": lambda: c.start("s", attributes={"": "v"}),
            "attributes too many": lambda: c.start("s", attributes={str(i): "v" for i in range(33)}),
            "attributes key too long": lambda: c.start("s", attributes={"é" * 129: "v"}),
            "session_id empty": lambda: c.token(""),
            "session_id not str": lambda: c.token(7),
            "session_id too long": lambda: c.token("x" * 257),
            "session_id too many bytes": lambda: c.end("é" * 129),
            "time zero": lambda: c.token("s", 0),
            "time float": lambda: c.token("s", 1.5e18),
            "time too big": lambda: c.start("s", 1 << 63),
            "count zero": lambda: c.token("s", count=0),
            "count bool": lambda: c.token("s", count=True),
            "count over the cap": lambda: c.token("s", count=65537),
            "seq negative": lambda: c.token("s", seq=-1),
            "queue_time_ns negative": lambda: c.end("s", queue_time_ns=-1),
            "prefill_time_ns float": lambda: c.end("s", prefill_time_ns=0.5),
            "engine_time_decode_ns negative": lambda: c.end("s", engine_time_decode_ns=-1),
            "energy_mj without the engine time": lambda: c.end("s", energy_mj=5),
            "stream not bool": lambda: c.start("s", stream="no"),
            "tracestate not ascii": lambda: c.start("s", tracestate="ot=th:\u00e9"),
            "tracestate too long": lambda: c.start("s", tracestate="a" * 513),
            "completion_tokens negative": lambda: c.end("s", completion_tokens=-5),
            "finish_reason not str": lambda: c.end("s", finish_reason=["stop"]),
        }
        for name, call in cases.items():
            with self.subTest(name), self.assertRaises(ValueError):
                call()
        self.assertTrue(c.flush())
        self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 0, "rejected": 0})

    def test_config_errors_raise(self):
        udp = self.sink.endpoint
        cases = {
            "headers on udp": lambda: Client(udp, headers={"Authorization": "x"}),
            "request_timeout on udp": lambda: Client(udp, request_timeout=1),
            "request_timeout negative": lambda: Client("http://127.0.0.1:1", request_timeout=-1),
            "request_timeout bool": lambda: Client("http://127.0.0.1:1", request_timeout=True),
            "header name": lambda: Client("http://127.0.0.1:1", headers={"Bad Name": "x"}),
            "header empty name": lambda: Client("http://127.0.0.1:1", headers={"": "x"}),
            "header line break": lambda: Client("http://127.0.0.1:1", headers={"X-A": "a\r\nX-B: b"}),
            "header not str": lambda: Client("http://127.0.0.1:1", headers={"X-A": 1}),
            "max_batch_lines zero": lambda: Client(udp, max_batch_lines=0),
            "max_batch_lines negative": lambda: Client("http://127.0.0.1:1", max_batch_lines=-1),
            "max_batch_lines float": lambda: Client("http://127.0.0.1:1", max_batch_lines=500.0),
            "max_batch_lines bool": lambda: Client("http://127.0.0.1:1", max_batch_lines=True),
        }
        for name, call in cases.items():
            with self.subTest(name), self.assertRaises(ValueError):
                call()
        Client(udp, headers={}).close()  # empty is not set

    def test_limits_accepted(self):
        c = self.client
        c.token("x" * 256, T0)
        c.end("é" * 128, T0)
        c.start("s", T0, attributes={str(i): "v" for i in range(32)})
        c.start("s-2", T0, attributes={"é" * 128: "v" * 1000})  # a value over 256 bytes: the receiver cuts it
        self.assertEqual(len(self.sink.lines(4)), 4)


class UDPTest(unittest.TestCase):
    def setUp(self):
        self.sink = UDPSink()

    def tearDown(self):
        self.sink.close()

    def test_exact_wire_lines(self):
        with Client(self.sink.endpoint) as c:
            c.start("sess-1", T0, trace_id=TRACE_ID.upper(), span_id=SPAN_ID, parent_span_id=PARENT_SPAN_ID,
                    model="llama-3-8b", operation="chat", prompt_tokens=12, engine="vllm-0",
                    attributes={"quantization": "fp8", "tenant": "a"})
            c.token("sess-1", T0 + 1000)
            c.token("sess-1", T0 + 2000, count=3)
            c.end("sess-1", T0 + 3000, completion_tokens=4, finish_reason="stop", error="ValueError")
            c.start("sess-2", T0)
            c.end("sess-2", T0 + 1)
            c.start("sess-3", T0, model="", engine="", attributes={}, trace_id=None)
            c.end("sess-3", T0 + 1, finish_reason="", error="")
            c.start("sess-4", T0, stream=False, tracestate="ot=th:8,vendor=x")
            c.token("sess-4", T0 + 1, seq=0)
            c.token("sess-4", T0 + 2, count=2, seq=1)
            c.end("sess-4", T0 + 3, response_model="m-fp8", queue_time_ns=120000000, prefill_time_ns=0)
            c.end("sess-5", T0 + 4, engine_time_decode_ns=7000, energy_mj=12)
        self.assertEqual(self.sink.lines(13), [
            '{"event":"start","session_id":"sess-1","time_unix_nano":1700000000000000000,'
            '"trace_id":"0af7651916cd43dd8448eb211c80319c","span_id":"b7ad6b7169203331",'
            '"parent_span_id":"00f067aa0ba902b7","model":"llama-3-8b","operation":"chat","prompt_tokens":12,'
            '"engine":"vllm-0","attributes":{"quantization":"fp8","tenant":"a"}}',
            '{"event":"token","session_id":"sess-1","time_unix_nano":1700000000000001000}',
            '{"event":"token","session_id":"sess-1","time_unix_nano":1700000000000002000,"count":3}',
            '{"event":"end","session_id":"sess-1","time_unix_nano":1700000000000003000,'
            '"completion_tokens":4,"finish_reason":"stop","error":"ValueError"}',
            '{"event":"start","session_id":"sess-2","time_unix_nano":1700000000000000000}',
            '{"event":"end","session_id":"sess-2","time_unix_nano":1700000000000000001}',
            '{"event":"start","session_id":"sess-3","time_unix_nano":1700000000000000000}',
            '{"event":"end","session_id":"sess-3","time_unix_nano":1700000000000000001}',
            '{"event":"start","session_id":"sess-4","time_unix_nano":1700000000000000000,"stream":false,'
            '"tracestate":"ot=th:8,vendor=x"}',
            '{"event":"token","session_id":"sess-4","time_unix_nano":1700000000000000001,"seq":0}',
            '{"event":"token","session_id":"sess-4","time_unix_nano":1700000000000000002,"count":2,"seq":1}',
            '{"event":"end","session_id":"sess-4","time_unix_nano":1700000000000000003,"response_model":"m-fp8",'
            '"queue_time_ns":120000000,"prefill_time_ns":0}',
            '{"event":"end","session_id":"sess-5","time_unix_nano":1700000000000000004,'
            '"engine_time_prefill_ns":0,"engine_time_decode_ns":7000,"energy_mj":12}',
        ])
        self.assertEqual(c.stats(), {"sent": 13, "dropped": 0, "failed": 0, "rejected": 0})

    def test_int_ids_and_escaping(self):
        with Client(self.sink.endpoint) as c:
            c.start("s\"\n\u00e9\u4e2d", T0, trace_id=int(TRACE_ID, 16), span_id=int(SPAN_ID, 16),
                    attributes={"k": "v\t\u0001"})
            c.token("lone\ud800", T0)
        lines = self.sink.lines(2)
        self.assertEqual(lines[0], '{"event":"start","session_id":"s\\"\\n\u00e9\u4e2d","time_unix_nano":%d,'
                                   '"trace_id":"%s","span_id":"%s","attributes":{"k":"v\\t\\u0001"}}'
                         % (T0, TRACE_ID, SPAN_ID))
        # Not valid UTF-8 raw, so written as a JSON escape.
        self.assertEqual(lines[1], '{"event":"token","session_id":"lone\\ud800","time_unix_nano":%d}' % T0)

    def test_default_time_is_now(self):
        before = time.time_ns()
        with Client(self.sink.endpoint) as c:
            c.token("s")
        after = time.time_ns()
        t = json.loads(self.sink.lines(1)[0])["time_unix_nano"]
        self.assertTrue(before <= t <= after)

    def test_datagrams_hold_whole_lines(self):
        with Client(self.sink.endpoint, max_batch_bytes=256, flush_interval=30) as c:
            for i in range(40):
                c.token("session-%d" % (i % 3), T0 + i, count=i + 1)
        want = ['{"event":"token","session_id":"session-%d","time_unix_nano":%d%s}'
                % (i % 3, T0 + i, "" if i == 0 else ',"count":%d' % (i + 1)) for i in range(40)]
        self.assertEqual(self.sink.lines(40), want)
        self.assertGreater(len(self.sink.datagrams), 5)
        for d in self.sink.datagrams:
            self.assertLessEqual(len(d), 256)
            self.assertTrue(d.endswith(b"\n"))
        self.assertEqual(c.stats()["sent"], 40)

    def test_datagrams_split_by_lines(self):
        with Client(self.sink.endpoint, max_batch_lines=4, flush_interval=30) as c:
            for i in range(10):
                c.token("s", T0 + i)
        self.assertEqual(len(self.sink.lines(10)), 10)
        self.assertEqual([d.count(b"\n") for d in self.sink.datagrams], [4, 4, 2])
        self.assertEqual(c.stats()["sent"], 10)

    def test_line_longer_than_datagram_rejected(self):
        with Client(self.sink.endpoint) as c:
            c.token("before", T0)
            c.start("big", T0, attributes={"k%d" % i: "v" * 300 for i in range(30)})
            c.token("after", T0)
        lines = self.sink.lines(2)
        self.assertEqual([json.loads(ln)["session_id"] for ln in lines], ["before", "after"])
        self.assertEqual(c.stats(), {"sent": 2, "dropped": 0, "failed": 0, "rejected": 1})

    def test_flush_interval_sends_without_close(self):
        c = Client(self.sink.endpoint, flush_interval=0.05)
        self.addCleanup(c.close)
        c.token("s", T0)
        self.assertEqual(len(self.sink.lines(1, timeout=2)), 1)
        c.token("s", T0 + 1)
        self.assertEqual(len(self.sink.lines(2, timeout=2)), 2)

    @unittest.skipUnless(hasattr(os, "fork"), "needs os.fork")
    def test_forked_child_sends(self):
        c = Client(self.sink.endpoint, flush_interval=60)
        self.addCleanup(c.close)
        c.token("parent", T0)
        self.assertTrue(c.flush())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
            pid = os.fork()
        if pid == 0:  # child: the sender thread did not survive the fork
            code = 1
            try:
                c.token("child", T0)
                c.close(timeout=5)
                code = 0 if c.stats()["sent"] == 2 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode")
                         else status >> 8, 0)
        self.assertEqual([json.loads(ln)["session_id"] for ln in self.sink.lines(2)], ["parent", "child"])

    def test_flush(self):
        c = Client(self.sink.endpoint, flush_interval=60)
        self.addCleanup(c.close)
        for i in range(10):
            c.token("s", T0 + i)
        self.assertTrue(c.flush(timeout=5))
        self.assertEqual(c.stats()["sent"], 10)
        self.assertEqual(len(self.sink.lines(10)), 10)


class HTTPTest(unittest.TestCase):
    def setUp(self):
        self.sink = HTTPSink()
        self.addCleanup(self.sink.close)

    def test_post_with_headers(self):
        headers = {"Authorization": "Bearer secret-token", "X-Scope-OrgID": "tenant-a",
                   "Content-Type": "text/plain"}
        with Client(self.sink.url, headers=headers) as c:
            c.start("s1", T0, model="m", operation="text_completion", prompt_tokens=0)
            c.token("s1", T0 + 5, count=2)
            c.end("s1", T0 + 9, completion_tokens=2)
        self.assertEqual(len(self.sink.requests), 1)
        path, got, body = self.sink.requests[0]
        self.assertEqual(path, "/v1/token-events")
        self.assertEqual(got["Content-Type"], "application/x-ndjson")
        self.assertEqual(got["Authorization"], "Bearer secret-token")
        self.assertEqual(got["X-Scope-OrgID"], "tenant-a")
        self.assertEqual(body.decode(), (
            '{"event":"start","session_id":"s1","time_unix_nano":%d,"model":"m","operation":"text_completion",'
            '"prompt_tokens":0}\n'
            '{"event":"token","session_id":"s1","time_unix_nano":%d,"count":2}\n'
            '{"event":"end","session_id":"s1","time_unix_nano":%d,"completion_tokens":2}\n'
        ) % (T0, T0 + 5, T0 + 9))
        self.assertEqual(c.stats(), {"sent": 3, "dropped": 0, "failed": 0, "rejected": 0})

    def test_default_path(self):
        with Client("http://127.0.0.1:%d" % self.sink.port) as c:
            c.token("s", T0)
        self.assertEqual(self.sink.requests[0][0], "/v1/token-events")

    def test_batches_split_by_size(self):
        with Client(self.sink.url, max_batch_bytes=300, flush_interval=30) as c:
            for i in range(30):
                c.token("s", T0 + i)
        bodies = self.sink.bodies()
        self.assertGreater(len(bodies), 5)
        for b in bodies:
            self.assertLessEqual(len(b), 300)
            self.assertTrue(b.endswith(b"\n"))
        self.assertEqual([json.loads(ln)["time_unix_nano"] for ln in self.sink.lines()], [T0 + i for i in range(30)])
        self.assertEqual(c.stats()["sent"], 30)

    def test_batches_split_by_lines(self):
        # Far below max_batch_bytes: the receiver reads no more lines of a body.
        with Client(self.sink.url, max_batch_lines=5, flush_interval=30) as c:
            for i in range(23):
                c.token("s", T0 + i)
        self.assertEqual([b.count(b"\n") for b in self.sink.bodies()], [5, 5, 5, 5, 3])
        self.assertEqual([json.loads(ln)["time_unix_nano"] for ln in self.sink.lines()], [T0 + i for i in range(23)])
        self.assertEqual(c.stats(), {"sent": 23, "dropped": 0, "failed": 0, "rejected": 0})

    def test_receiver_stated_limits_adopted(self):
        # A receiver configured below the defaults states its limits when a
        # batch broke one; the client keeps its next batches within them and
        # never raises its own.
        line = len(b'{"event":"token","session_id":"s","time_unix_nano":%d}\n' % T0)

        def lines_per_body():
            return [b.count(b"\n") for b in self.sink.bodies()]

        with self.subTest("max_lines_per_batch and max_line_bytes"):
            self.sink.requests = []
            self.sink.limits = {"max_lines_per_batch": 4, "max_line_bytes": 1000, "max_request_body_size": 1 << 20}
            # close takes the queue at once: the first batch (10 lines, the
            # client's own bound) breaks the receiver's 4 and learns them.
            with Client(self.sink.url, max_batch_lines=10, flush_interval=30) as c:
                for i in range(10):
                    c.token("s", T0 + i)
                c.start("s-2", T0, attributes={"big": "x" * 1000})  # over the learned max_line_bytes
                for i in range(9):
                    c.token("s", T0 + 10 + i)
            self.assertEqual(lines_per_body(), [10, 4, 4, 1])
            self.assertEqual(c.stats(), {"sent": 4 + 9, "dropped": 0, "failed": 0, "rejected": 6 + 1})

        with self.subTest("max_request_body_size"):
            self.sink.requests = []
            self.sink.limits = dict(RECEIVER_LIMITS, max_request_body_size=3 * line)
            with Client(self.sink.url, max_batch_bytes=8 * line, flush_interval=30) as c:
                for i in range(14):
                    c.token("s", T0 + i)
            # The first batch (8 lines) fails whole with a 413.
            self.assertEqual(lines_per_body(), [8, 3, 3])
            self.assertEqual(c.stats(), {"sent": 6, "dropped": 0, "failed": 8, "rejected": 0})

        with self.subTest("never raised"):
            self.sink.requests = []
            self.sink.limits = None
            self.sink.response = {"accepted": 2, "rejected": 0, "errors": [],
                                  "limits": dict(RECEIVER_LIMITS, max_line_bytes=65536)}
            with Client(self.sink.url, max_batch_lines=2, max_batch_bytes=4 * line, flush_interval=30) as c:
                for i in range(5):
                    c.token("s", T0 + i)
            self.assertEqual(lines_per_body(), [2, 2, 1])
            self.assertEqual(c.stats(), {"sent": 5, "dropped": 0, "failed": 0, "rejected": 0})

    def test_close_flushes_and_is_idempotent(self):
        c = Client(self.sink.url, flush_interval=60)
        for i in range(5):
            c.token("s", T0 + i)
        self.assertEqual(self.sink.requests, [])
        began = time.monotonic()
        c.close(timeout=5)
        self.assertLess(time.monotonic() - began, 3)
        self.assertEqual(len(self.sink.lines()), 5)
        c.close()
        c.token("s", T0 + 9)  # after close: dropped, never raises or blocks
        self.assertEqual(c.stats(), {"sent": 5, "dropped": 1, "failed": 0, "rejected": 0})
        self.assertFalse(c._thread.is_alive())

    def test_error_status_counts_failed(self):
        for status in (400, 401, 404, 500, 503):
            with self.subTest(status=status):
                self.sink.status = status
                with Client(self.sink.url) as c:
                    c.start("s", T0)
                    c.token("s", T0 + 1)
                self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 2, "rejected": 0})

    def test_transport_error_counts_failed(self):
        with Client("http://127.0.0.1:%d/v1/token-events" % free_port()) as c:
            c.token("s", T0)
        self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 1, "rejected": 0})

    def test_request_timeout_counts_failed(self):
        self.sink.gate.clear()
        c = Client(self.sink.url, request_timeout=0.2)
        c.token("s", T0)
        self.assertTrue(c.flush(timeout=5))
        self.assertEqual(c.stats()["failed"], 1)
        self.sink.gate.set()
        c.close()

    def test_503_with_short_retry_after_retried_once(self):
        self.sink.answers = [(503, {"Retry-After": "0"}, {})]
        with Client(self.sink.url) as c:
            c.token("s", T0)
            c.token("s", T0 + 1)
        self.assertEqual(c.stats(), {"sent": 2, "dropped": 0, "failed": 0, "rejected": 0})
        self.assertEqual(len(self.sink.requests), 2)

    def test_503_retried_only_once(self):
        self.sink.answers = [(503, {"Retry-After": "0"}, {})] * 3
        with Client(self.sink.url) as c:
            c.token("s", T0)
        self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 1, "rejected": 0})
        self.assertEqual(len(self.sink.requests), 2)

    def test_503_without_short_retry_after_not_retried(self):
        for headers in ({}, {"Retry-After": "5"}, {"Retry-After": "soon"}):
            with self.subTest(headers=headers):
                self.sink.requests = []
                self.sink.answers = [(503, headers, {})]
                with Client(self.sink.url) as c:
                    c.token("s", T0)
                self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 1, "rejected": 0})
                self.assertEqual(len(self.sink.requests), 1)

    def test_rejected_lines_of_an_error_status(self):
        # The receiver answers 400 when no line of the batch is valid, and a
        # 503 names the lines it rejected too: those are rejected, the rest failed.
        for status, response, want in (
                (400, {"accepted": 0, "rejected": 3, "errors": []}, {"failed": 0, "rejected": 3}),
                (503, {"accepted": 0, "rejected": 1, "errors": [], "error": "pipeline refused the batch"},
                 {"failed": 2, "rejected": 1}),
                (200, {"accepted": 0, "rejected": 7}, {"failed": 0, "rejected": 3}),
                (400, {"rejected": True}, {"failed": 3, "rejected": 0}),
        ):
            with self.subTest(status=status, response=response):
                self.sink.status, self.sink.response = status, response
                with Client(self.sink.url) as c:
                    for i in range(3):
                        c.token("s", T0 + i)
                self.assertEqual(c.stats(), dict(want, sent=0, dropped=0))

    def test_redirect_not_followed(self):
        self.sink.answers = [(307, {"Location": "/elsewhere"}, {})]
        with Client(self.sink.url) as c:
            c.token("s", T0)
        self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 1, "rejected": 0})
        self.assertEqual([r[0] for r in self.sink.requests], ["/v1/token-events"])

    def test_proxy_environment_ignored(self):
        proxy = HTTPSink()
        self.addCleanup(proxy.close)
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("no_proxy", "http_proxy", "https_proxy")}
        env["http_proxy"] = env["HTTP_PROXY"] = "http://127.0.0.1:%d" % proxy.port
        with mock.patch.dict(os.environ, env, clear=True):
            # The environment does reach urllib's default opener.
            req = urllib.request.Request(self.sink.url, data=b"{}\n", method="POST",
                                         headers={"Content-Type": "application/x-ndjson"})
            urllib.request.build_opener().open(req, timeout=5).close()
            self.assertEqual(len(proxy.requests), 1)
            with Client(self.sink.url) as c:
                c.token("s", T0)
        self.assertEqual(c.stats(), {"sent": 1, "dropped": 0, "failed": 0, "rejected": 0})
        self.assertEqual(len(proxy.requests), 1)
        self.assertEqual(self.sink.lines(), ['{"event":"token","session_id":"s","time_unix_nano":%d}' % T0])

    def test_line_over_receiver_limit_rejected(self):
        # Within the 1 MiB batch, but over the receiver's 16 KiB line limit.
        with Client(self.sink.url) as c:
            c.start("big", T0, attributes={"big": "x" * (16 << 10)})
            c.token("s", T0)
        self.assertEqual(c.stats(), {"sent": 1, "dropped": 0, "failed": 0, "rejected": 1})
        self.assertEqual(len(self.sink.lines()), 1)

    def test_rejected_lines_counted(self):
        errors = [{"line": 2, "message": "count: must be at least 1"}]
        for response in ({"accepted": 2, "rejected": 1, "errors": errors},
                         # Limits it cannot read do not void the count.
                         {"accepted": 2, "rejected": 1, "errors": errors, "limits": {"max_lines_per_batch": "many"}},
                         {"accepted": 2, "rejected": 1, "errors": errors, "limits": [1]}):
            with self.subTest(response=response):
                self.sink.response = response
                with Client(self.sink.url) as c:
                    for i in range(3):
                        c.token("s", T0 + i)
                self.assertEqual(c.stats(), {"sent": 2, "dropped": 0, "failed": 0, "rejected": 1})
                self.assertEqual(c._max_batch_lines, 10000)

    def test_full_queue_drops_without_blocking(self):
        self.sink.gate.clear()
        c = Client(self.sink.url, queue_size=4, flush_interval=0.01)
        self.addCleanup(c.close, 1)
        c.token("s", T0)
        # The sender thread now hangs in a POST, so the queue fills up.
        self.assertTrue(self.sink.started.wait(5))
        began = time.monotonic()
        for i in range(1, 11):
            c.token("s", T0 + i)
        self.assertLess(time.monotonic() - began, 0.5)
        self.assertEqual(c.stats()["dropped"], 6)
        self.sink.gate.set()
        c.close(timeout=5)
        self.assertEqual(c.stats(), {"sent": 5, "dropped": 6, "failed": 0, "rejected": 0})
        self.assertEqual([json.loads(ln)["time_unix_nano"] for ln in self.sink.lines()], [T0 + i for i in range(5)])

    def test_backlog_after_pause_within_receiver_line_limit(self):
        # The receiver reads at most max_lines_per_batch (10 000) lines of a
        # batch and rejects the rest; a 1 MiB batch holds about 13 000 of these
        # token lines. While the receiver is paused, a backlog of several
        # batches queues up; once it answers, none of it may be rejected.
        self.sink.limits = RECEIVER_LIMITS
        self.sink.gate.clear()
        c = Client(self.sink.url, request_timeout=60)
        self.addCleanup(c.close, 1)
        c.token("first", T0)
        self.assertTrue(self.sink.started.wait(10))  # the sender thread now hangs in a POST
        backlog = 45000
        for i in range(backlog):
            c.token("session-%02d" % (i % 64), T0 + i)
        self.sink.gate.set()
        self.assertTrue(c.flush(timeout=60))
        s = c.stats()
        self.assertEqual(s["rejected"], 0, s)
        self.assertEqual(s["sent"] + s["dropped"] + s["failed"] + s["rejected"], 1 + backlog, s)
        self.assertEqual(s, {"sent": 1 + backlog, "dropped": 0, "failed": 0, "rejected": 0})
        self.assertEqual(len(self.sink.lines()), 1 + backlog)

    def test_failure_log_has_no_secrets(self):
        self.sink.status = 500
        with self.assertLogs("otelcol_llm_hook", logging.WARNING) as logs:
            with Client(self.sink.url, headers={"Authorization": "Bearer secret-token"}) as c:
                c.start("s", T0, model="m")
        text = "\n".join(logs.output)
        self.assertIn("status 500", text)
        self.assertNotIn("secret-token", text)


def collector_binary():
    return os.environ.get("OTELCOL_LLM_BIN") or os.path.normpath(os.path.join(HERE, "..", "..", "bin", "otelcol-llm"))


class UnixSink:
    """A Unix socket standing in for the receiver's hooks::unix: it reads lines and answers each read's lines
    with ack(lines), a function returning the acknowledgement (bytes) or None for none."""

    def __init__(self, ack=None):
        self.dir = tempfile.mkdtemp(prefix="hk")
        self.path = os.path.join(self.dir, "hooks.sock")
        self.endpoint = "unix://" + self.path
        self.ack = ack or (lambda lines: b'{"accepted":%d,"rejected":0,"refused":0,"errors":[]}\n' % len(lines))
        self.lines = []
        self.conns = []
        self.lock = threading.Lock()
        self.listen()

    def listen(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._accept, args=(self.sock,), daemon=True)
        self.thread.start()

    def _accept(self, ls):
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            with self.lock:
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        try:
            while True:
                chunk = c.recv(65536)
                if not chunk:
                    break
                buf += chunk
                *lines, buf = buf.split(b"\n")
                lines = [ln for ln in lines if ln]
                with self.lock:
                    self.lines.extend(ln.decode("utf-8") for ln in lines)
                a = self.ack(lines) if lines else None
                if a:
                    c.sendall(a)
        except OSError:
            pass
        finally:
            c.close()

    def stop(self):
        """A collector stopping: the listener and every connection closed, the socket file removed."""
        self.sock.close()
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self.conns = []
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, True)


class UnixTest(unittest.TestCase):
    """The Unix socket transport: lines in flight until acknowledged, the unacknowledged failed."""

    def test_endpoint_parsing(self):
        p = hook._parse_endpoint
        self.assertEqual(p("unix:///run/otelcol-llm/hooks.sock"), ("unix", "/run/otelcol-llm/hooks.sock"))
        for bad in ("unix://host/x.sock", "unix://", "unix:///" + "x" * 120):
            with self.subTest(endpoint=bad), self.assertRaises(ValueError):
                Client(bad)
        with self.assertRaises(ValueError):
            Client("unix:///x.sock", headers={"Authorization": "x"})
        with Client("unix:///nonexistent/x.sock") as c:
            self.assertEqual(c._max_batch_bytes, 256 << 10)

    def test_empty_endpoint_is_the_nodes_collector(self):
        with mock.patch("os.path.isdir", return_value=True):
            self.assertEqual(hook.node_endpoint(), "unix:///run/otelcol-llm/hooks.sock")
            self.assertEqual(hook._parse_endpoint(None), ("unix", "/run/otelcol-llm/hooks.sock"))
        with mock.patch("os.path.isdir", return_value=False):
            self.assertEqual(hook.node_endpoint(), "udp://127.0.0.1:4321")
            self.assertEqual(hook._parse_endpoint(""), ("udp", ("127.0.0.1", 4321)))

    def test_acknowledgements_settle(self):
        n = [0]

        def ack(lines):
            out = b""
            for _ in lines:
                n[0] += 1
                kind = n[0] % 3
                out += (b'{"accepted":1,"rejected":0,"refused":0,"errors":[]}\n' if kind == 1 else
                        b'{"accepted":0,"rejected":1,"refused":0,"errors":[{"line":%d,"message":"x: bad"}]}\n' % n[0]
                        if kind == 2 else b'{"accepted":0,"rejected":0,"refused":1,"errors":[]}\n')
            return out

        sink = UnixSink(ack)
        self.addCleanup(sink.close)
        c = Client(sink.endpoint, flush_interval=0.001)
        for i in range(30):
            c.token("s%d" % i, T0 + i)
        self.assertTrue(c.flush(timeout=10))
        self.assertEqual(c.stats(), {"sent": 10, "dropped": 0, "failed": 10, "rejected": 10})
        c.close()
        self.assertEqual(len(sink.lines), 30)
        self.assertEqual(json.loads(sink.lines[0]), {"event": "token", "session_id": "s0", "time_unix_nano": T0})

    def test_close_waits_for_acknowledgements_then_fails_the_rest(self):
        sink = UnixSink(lambda lines: None)  # never acknowledges
        self.addCleanup(sink.close)
        c = Client(sink.endpoint, request_timeout=0.2)
        for i in range(5):
            c.token("s", T0 + i)
        c.close(timeout=5)
        self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 5, "rejected": 0})
        self.assertEqual(len(sink.lines), 5)

    def test_no_collector_fails_at_once(self):
        c = Client("unix:///nonexistent-dir/hooks.sock")
        for i in range(5):
            c.token("s", T0 + i)
        t0 = time.monotonic()
        c.close()
        self.assertLess(time.monotonic() - t0, 5)
        self.assertEqual(c.stats(), {"sent": 0, "dropped": 0, "failed": 5, "rejected": 0})

    def test_restart_reconnects_and_counts_what_was_in_flight(self):
        # The first collector takes lines but acknowledges none, then stops:
        # they were in flight and count failed. The second one is reached
        # by reconnecting.
        sink = UnixSink(lambda lines: None)
        self.addCleanup(sink.close)
        c = Client(sink.endpoint, flush_interval=0.001)
        self.addCleanup(c.close)
        for i in range(10):
            c.token("s", T0 + i)
        wait_for(lambda: len(sink.lines) == 10)
        sink.stop()
        self.assertTrue(wait_for(lambda: c.stats()["failed"] == 10))
        sink.ack = lambda lines: b'{"accepted":%d,"rejected":0,"refused":0,"errors":[]}\n' % len(lines)
        sink.listen()
        taken = 10

        def more():
            nonlocal taken
            c.token("s", T0 + taken)
            taken += 1
            return c.stats()["sent"] > 0

        self.assertTrue(wait_for(more, timeout=15))
        self.assertTrue(c.flush(timeout=10))
        st = c.stats()
        self.assertEqual(st["sent"] + st["failed"] + st["dropped"] + st["rejected"], taken, st)

    def test_forked_child_does_not_share_the_connection(self):
        sink = UnixSink()
        self.addCleanup(sink.close)
        c = Client(sink.endpoint, flush_interval=0.001)
        self.addCleanup(c.close)
        c.token("parent", T0)
        self.assertTrue(c.flush(timeout=10))
        pid = os.fork()
        if pid == 0:  # the child: its own connection, its own events
            code = 1
            try:
                before = c.stats()["sent"]  # the parent's, copied
                c.token("child", T0 + 1)
                code = 0 if c.flush(timeout=10) and c.stats()["sent"] == before + 1 else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        c.token("parent", T0 + 2)
        self.assertTrue(c.flush(timeout=10))
        self.assertEqual(c.stats()["sent"], 2)


class OTLPSink(HTTPSink):
    """Collects the OTLP/JSON ExportLogsServiceRequest bodies the otlphttp exporter posts."""

    def __init__(self):
        super().__init__(response={})

    def records(self, session_id=None):
        out = []
        for body in self.bodies():
            req = json.loads(body)
            for rl in req.get("resourceLogs", []):
                for sl in rl.get("scopeLogs", []):
                    for rec in sl.get("logRecords", []):
                        for rec_attrs in session_records(rec, attributes(rec)):
                            if session_id is None or rec_attrs[1].get("llm.session.id") == session_id:
                                out.append(rec_attrs)
        return out


def session_records(rec, attrs):
    """A batch token record (llm.token.sessions: the tokens of several sessions) as one (record, attributes) per
    session entry, the attributes those of the session's own packed record; any other record as it is."""
    sessions = attrs.get("llm.token.sessions")
    if rec.get("eventName") != "llm.token" or sessions is None:
        return [(rec, attrs)]
    # Each entry "<ID length in bytes> <session ID> <events>", newline-separated.
    raw, out, i = sessions.encode(), [], 0
    while i < len(raw):
        space = raw.index(b" ", i)
        n = int(raw[i:space])
        sid = raw[space + 1:space + 1 + n].decode()
        end = raw.find(b"\n", space + 2 + n)
        end = len(raw) if end < 0 else end
        out.append((rec, {"llm.session.id": sid, "llm.token.events": raw[space + 2 + n:end].decode()}))
        i = end + 1
    return out


def any_value(v):
    """Convert an OTLP/JSON AnyValue to a Python value."""
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])  # a string in OTLP/JSON
    if "boolValue" in v:
        return v["boolValue"]
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in v["arrayValue"].get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: any_value(kv.get("value", {})) for kv in v["kvlistValue"].get("values", [])}
    return None


def attributes(rec):
    return {kv["key"]: any_value(kv.get("value", {})) for kv in rec.get("attributes", [])}


class CollectorTestCase(unittest.TestCase):
    """A test against the built collector: the token_stream hooks on free loopback ports, the logs pipeline's
    ``processors`` (none: the token events themselves), otlp_http (JSON) to a Python sink."""

    # Processor name -> its config, in pipeline order.
    processors = {}

    def setUp(self):
        binary = collector_binary()
        if not os.access(binary, os.X_OK):
            msg = "collector binary %s not found (build it, or set OTELCOL_LLM_BIN)" % binary
            if os.environ.get("CI"):
                self.fail(msg)
            self.skipTest(msg)
        self.tmp = tempfile.mkdtemp(prefix="otelcol-llm-hook-test-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        self.sink = OTLPSink()
        self.addCleanup(self.sink.close)
        self.http_port = free_port()
        self.udp_port = free_port(socket.SOCK_DGRAM)
        self.unix_path = os.path.join(self.tmp, "hooks.sock")
        config = {
            "receivers": {"token_stream": {"hooks": {
                "http": {"endpoint": "127.0.0.1:%d" % self.http_port},
                "udp": {"endpoint": "127.0.0.1:%d" % self.udp_port},
                "unix": {"endpoint": self.unix_path},
            }}},
            # otlp_http is the exporter's type since v0.165.0; "otlphttp" is its deprecated alias.
            "exporters": {"otlp_http": {
                "logs_endpoint": "http://127.0.0.1:%d/v1/logs" % self.sink.port,
                "encoding": "json",
                "compression": "none",
                "sending_queue": {"enabled": False},
            }},
            "service": {
                "pipelines": {"logs": {"receivers": ["token_stream"], "processors": list(self.processors),
                                       "exporters": ["otlp_http"]}},
                "telemetry": {"metrics": {"level": "none"}},
            },
        }
        if self.processors:
            config["processors"] = dict(self.processors)
        self.config_path = os.path.join(self.tmp, "config.yaml")
        with open(self.config_path, "w") as f:
            json.dump(config, f, indent=2)  # JSON is YAML
        self.log_path = os.path.join(self.tmp, "collector.log")
        self.log = open(self.log_path, "wb")
        self.addCleanup(self.log.close)
        self.binary = binary
        self.start_collector()
        self.addCleanup(self.stop_collector)

    def start_collector(self):
        self.proc = subprocess.Popen([self.binary, "--config", self.config_path], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.wait_ready()

    def stop_collector(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def collector_log(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")[-4000:]

    def wait_ready(self):
        def http_up():
            if self.proc.poll() is not None:
                return "exited"
            try:
                socket.create_connection(("127.0.0.1", self.http_port), timeout=0.2).close()
                return "up"
            except OSError:
                return None

        self.log.flush()
        ready_before = self.collector_log().count("Everything is ready")
        state = wait_for(http_up, timeout=20, interval=0.05)
        if state != "up":
            self.fail("collector %s before its HTTP hook listened; log:\n%s"
                      % ("exited" if state else "not ready in 20 s", self.collector_log()))
        # The UDP hook starts right after the HTTP one; the service logs this
        # line once every component has started.
        wait_for(lambda: self.collector_log().count("Everything is ready") > ready_before, timeout=5, interval=0.05)


class RealCollectorTest(CollectorTestCase):
    """The client against the built collector: token_stream receiver -> otlp_http exporter -> a Python sink."""

    def wait_session(self, session_id, tokens):
        """Wait until the sink holds the session's start, end and all its tokens; return its records."""
        def complete():
            recs = self.sink.records(session_id)
            names = [r.get("eventName") for r, _ in recs]
            if "llm.session.start" in names and "llm.session.end" in names \
                    and sum(c for _, c in token_events(recs)) == tokens:
                return recs
            return None

        recs = wait_for(complete, timeout=15, interval=0.05)
        if not recs:
            self.fail("session %s incomplete at the sink: %r\ncollector log:\n%s"
                      % (session_id, self.sink.records(session_id), self.collector_log()))
        return recs

    def check_session(self, recs, session_id, start, tokens, end, want_start_attrs, want_end_attrs):
        by_name = {}
        for rec, attrs in recs:
            by_name.setdefault(rec.get("eventName"), []).append((rec, attrs))
        self.assertEqual(sorted(by_name), ["llm.session.end", "llm.session.start", "llm.token"])
        self.assertEqual(len(by_name["llm.session.start"]), 1)
        self.assertEqual(len(by_name["llm.session.end"]), 1)

        rec, attrs = by_name["llm.session.start"][0]
        self.assertEqual(int(rec["timeUnixNano"]), start)
        self.assertEqual(rec.get("traceId", "").lower(), TRACE_ID)
        self.assertEqual(rec.get("spanId", "").lower(), SPAN_ID)
        self.assertEqual(attrs, dict(want_start_attrs, **{"llm.session.id": session_id}))

        self.assertEqual(sorted(token_events(recs)), sorted(tokens))
        for rec, attrs in by_name["llm.token"]:
            packed = attrs.get("llm.token.events")
            if packed:  # a packed record is stamped with its first event's time
                self.assertEqual(packed.split(" ")[0].split(":")[0], "0")

        rec, attrs = by_name["llm.session.end"][0]
        self.assertEqual(int(rec["timeUnixNano"]), end)
        self.assertEqual(attrs, dict(want_end_attrs, **{"llm.session.id": session_id}))

    def run_session(self, endpoint, session_id, finish_reason, error, **end_kwargs):
        base = time.time_ns()
        start = base
        tokens = [(base + 40_000_000, 1), (base + 60_000_000, 3), (base + 80_000_000, 1), (base + 95_000_000, 2)]
        end = base + 100_000_000
        with Client(endpoint) as c:
            c.start(session_id, start, trace_id=TRACE_ID, span_id=SPAN_ID, parent_span_id=PARENT_SPAN_ID,
                    model="llama-3-8b", operation="chat", prompt_tokens=42, engine="vllm-0",
                    attributes={"quantization": "fp8"})
            for t, n in tokens:
                c.token(session_id, t, count=n)
            c.end(session_id, end, completion_tokens=7, finish_reason=finish_reason, error=error, **end_kwargs)
            self.assertTrue(c.flush(timeout=10))
            self.assertEqual(c.stats(), {"sent": 6, "dropped": 0, "failed": 0, "rejected": 0})
        recs = self.wait_session(session_id, sum(n for _, n in tokens))
        want_end = {"gen_ai.usage.output_tokens": 7, "gen_ai.response.finish_reasons": [finish_reason]}
        if error:
            want_end["error.type"] = error
        for k, v in end_kwargs.items():
            want_end["llm.session." + k] = v
        self.check_session(
            recs, session_id, start, tokens, end,
            {
                "gen_ai.request.model": "llama-3-8b",
                "gen_ai.operation.name": "chat",
                "gen_ai.usage.input_tokens": 42,
                "llm.engine": "vllm-0",
                "llm.session.parent_span_id": PARENT_SPAN_ID,
                "llm.session.attributes": {"quantization": "fp8"},
            },
            want_end,
        )

    def test_http_session_reaches_pipeline(self):
        self.run_session("http://127.0.0.1:%d/v1/token-events" % self.http_port, "http-session-1", "stop", None)

    def test_udp_session_reaches_pipeline(self):
        self.run_session("udp://127.0.0.1:%d" % self.udp_port, "udp-session-1", "abort", "ClientDisconnected")

    def test_unix_session_reaches_pipeline(self):
        self.run_session("unix://" + self.unix_path, "unix-session-1", "length", None)

    def test_engine_share_reaches_pipeline(self):
        # An engine that sees its steps sends the request's share of its
        # time and energy; token_session reports it as it came.
        self.run_session("unix://" + self.unix_path, "unix-session-share", "stop", None,
                         engine_time_prefill_ns=3_500_000, engine_time_decode_ns=41_000_000, energy_mj=9_250)

    def test_unix_collector_restart(self):
        # The client streams across a collector restart: what the old
        # collector acknowledged is sent, what was in flight or written
        # while no collector listened is failed, and the client reconnects
        # by itself. Every event taken counts once, and the sink got those
        # counted sent.
        c = Client("unix://" + self.unix_path, flush_interval=0.005)
        self.addCleanup(c.close)
        base = time.time_ns()
        taken = 0

        def token():
            nonlocal taken
            c.token("restart-1", base + taken)
            taken += 1

        for _ in range(200):
            token()
        self.assertTrue(c.flush(timeout=10))
        self.assertEqual(c.stats()["sent"], 200)
        self.stop_collector()
        for _ in range(50):
            token()
        self.assertTrue(wait_for(lambda: c.stats()["failed"] > 0, timeout=10))
        self.start_collector()

        def sent_again():
            token()
            time.sleep(0.01)
            return c.stats()["sent"] > 200

        self.assertTrue(wait_for(sent_again, timeout=20), c.stats())
        self.assertTrue(c.flush(timeout=10))
        st = c.stats()
        self.assertEqual(st["sent"] + st["failed"] + st["dropped"] + st["rejected"], taken, st)
        got = wait_for(lambda: sum(n for _, n in token_events(self.sink.records("restart-1"))) == st["sent"],
                       timeout=15)
        self.assertTrue(got, "sink has %d tokens, client counted %d sent"
                        % (sum(n for _, n in token_events(self.sink.records("restart-1"))), st["sent"]))

    def test_single_token_records(self):
        # Token events in separate batches arrive as separate, unpacked records.
        # Over HTTP: each flush is a request of its own, while the UDP hook
        # packs the datagrams read within its batch_window together.
        base = time.time_ns()
        with Client("http://127.0.0.1:%d/v1/token-events" % self.http_port) as c:
            c.start("single", base)
            c.flush()
            c.token("single", base + 10, count=1)
            c.flush()
            c.token("single", base + 20, count=5)
            c.flush()
            c.end("single", base + 30)
        recs = self.wait_session("single", 6)
        toks = sorted((int(r["timeUnixNano"]), a) for r, a in recs if r.get("eventName") == "llm.token")
        self.assertEqual(toks, [(base + 10, {"llm.session.id": "single"}),
                                (base + 20, {"llm.session.id": "single", "llm.token.count": 5})])

    def test_backlog_after_pause_not_rejected(self):
        # The collector stops (SIGSTOP) while token events keep coming: the
        # client's sender hangs in a request and a backlog of several batches
        # queues up. Once the collector runs again, every event taken is
        # accounted for and the receiver's max_lines_per_batch (10 000)
        # rejected none of them.
        c = Client("http://127.0.0.1:%d/v1/token-events" % self.http_port, request_timeout=60)
        self.addCleanup(c.close, 1)
        os.kill(self.proc.pid, signal.SIGSTOP)
        self.addCleanup(self.continue_collector)
        base = time.time_ns()
        taken = 45000
        for i in range(taken):
            c.token("paused-%02d" % (i % 64), base + i)
        self.continue_collector()
        self.assertTrue(c.flush(timeout=60), "backlog not sent in 60 s: %r" % (c.stats(),))
        s = c.stats()
        self.assertEqual(s["rejected"], 0, s)
        self.assertEqual(s["sent"] + s["dropped"] + s["failed"] + s["rejected"], taken, s)
        self.assertEqual(s, {"sent": taken, "dropped": 0, "failed": 0, "rejected": 0})

        def paused_tokens():
            recs = [(r, a) for r, a in self.sink.records() if str(a.get("llm.session.id")).startswith("paused-")]
            return sum(n for _, n in token_events(recs))
        got = wait_for(lambda: paused_tokens() == taken, timeout=30, interval=0.2)
        self.assertTrue(got, "the sink holds %d of %d token events" % (paused_tokens(), taken))

    def test_limits_stated(self):
        # The answer the client lowers its bounds by: a batch cut at the
        # receiver's max_lines_per_batch states its limits.
        line = b'{"event":"token","session_id":"l","time_unix_nano":%d}\n' % time.time_ns()
        req = urllib.request.Request("http://127.0.0.1:%d/v1/token-events" % self.http_port, data=line * 10001,
                                     headers={"Content-Type": "application/x-ndjson"}, method="POST")
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30) as resp:
            self.assertEqual(resp.status, 200)
            got = json.loads(resp.read())
        self.assertEqual((got["accepted"], got["rejected"]), (10000, 1))
        self.assertEqual(got["limits"], RECEIVER_LIMITS)

    def continue_collector(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def test_rejected_lines_reported(self):
        # The response shape the client relies on for its rejected count.
        body = (b'{"event":"token","session_id":"r","time_unix_nano":1}\n'
                b'{"event":"token","session_id":"r","time_unix_nano":1,"count":0}\n'
                b'{"event":"token","session_id":"r","time_unix_nano":1,"model":"m"}\n')
        req = urllib.request.Request("http://127.0.0.1:%d/v1/token-events" % self.http_port, data=body,
                                     headers={"Content-Type": "application/x-ndjson"}, method="POST")
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=5) as resp:
            self.assertEqual(resp.status, 200)
            got = json.loads(resp.read())
        self.assertEqual(got["accepted"], 1)
        self.assertEqual(got["rejected"], 2)
        self.assertEqual([e["line"] for e in got["errors"]], [2, 3])
        for e in got["errors"]:
            self.assertIsInstance(e["message"], str)


def token_events(recs):
    """(time, count) of every token event in the records, packed or not."""
    out = []
    for rec, attrs in recs:
        if rec.get("eventName") != "llm.token":
            continue
        packed = attrs.get("llm.token.events")
        if packed is not None:
            # "<offset ns from the record's time>[:<count>][#<seq>]", space-separated
            base = int(rec["timeUnixNano"])
            for event in packed.split(" "):
                offset, _, count = event.split("#")[0].partition(":")
                out.append((base + int(offset), int(count) if count else 1))
        else:
            out.append((int(rec["timeUnixNano"]), attrs.get("llm.token.count", 1)))
    return out


if __name__ == "__main__":
    unittest.main()
