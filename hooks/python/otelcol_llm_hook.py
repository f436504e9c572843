"""Send LLM token events to the otelcol-llm token_stream receiver.

Import this inside the inference engine's Python process (e.g. vLLM) and call
``start``/``token``/``end`` per streamed request. The calls never block: they
validate their arguments, put a small tuple on a bounded in-memory queue and
return. A daemon thread encodes the events as NDJSON (the token_stream
receiver's wire schema v1: one JSON object per line, see the repository's
docs/wire-schema.md) and sends them in batches over UDP datagrams or HTTP
POST. When the queue is full, events are dropped and counted.

What counts as invalid, how long lines, rejected lines, proxies, timeouts and
retries are handled is the contract this client shares with the Go client,
pkg/tokenhook: hooks/README.md.

The API takes no prompt or completion text, so none can ever be sent or
logged. Standard library only, Python 3.9+.
"""

import atexit
import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections import deque

__all__ = ["Client", "DEFAULT_HTTP_PORT", "DEFAULT_UDP_PORT", "DEFAULT_HTTP_PATH", "DEFAULT_UNIX_SOCKET",
           "node_endpoint"]

DEFAULT_HTTP_PORT = 4320
DEFAULT_UDP_PORT = 4321
DEFAULT_HTTP_PATH = "/v1/token-events"
# The token_stream receiver's default hooks::unix::endpoint: the socket the
# node agent offers (a hostPath its DaemonSet shares with the engines' pods).
DEFAULT_UNIX_SOCKET = "/run/otelcol-llm/hooks.sock"
# One write on the Unix socket: a flush interval's events at a busy
# engine's rate.
DEFAULT_UNIX_BATCH_BYTES = 256 << 10
# The longest socket path (sockaddr_un's sun_path on Linux, its NUL excluded).
_MAX_UNIX_PATH_BYTES = 107
# Reconnection backoff on the Unix socket: doubled from the first to the
# last after each failed connect, reset by a successful one.
_FIRST_REDIAL_SECONDS = 0.1
_LAST_REDIAL_SECONDS = 5.0
# An acknowledgement line is at most this long (ten errors of a few hundred bytes).
_MAX_ACK_BYTES = 64 << 10

DEFAULT_HTTP_BATCH_BYTES = 1 << 20
DEFAULT_UDP_BATCH_BYTES = 8 << 10
# The receiver's default hooks::limits::max_lines_per_batch: it reads no more
# lines of a request body or datagram and rejects the rest.
DEFAULT_MAX_BATCH_LINES = 10000
# The largest payload of one UDP datagram.
MAX_UDP_DATAGRAM_BYTES = 65507

# The receiver's default limits (the Go client takes them from
# pkg/tokenevent); lines beyond them would be rejected, so they are
# refused here already.
MAX_LINE_BYTES = 16 << 10
MAX_SESSION_ID_BYTES = 256
MAX_ATTRIBUTES = 32
# An attribute key is a name: a longer one is refused, not cut (the values
# over their bound are cut by the receiver, alike on every path).
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_COUNT = 1 << 16
MAX_TRACESTATE_BYTES = 512
_MAX_INT64 = (1 << 63) - 1

OPERATIONS = ("chat", "text_completion")

DEFAULT_REQUEST_TIMEOUT = 5.0
# A 503 whose Retry-After is at most this many seconds is retried once after
# that delay; a longer one fails the batch, since events keep queueing (and
# dropping) meanwhile.
MAX_RETRY_AFTER_SECONDS = 1
# How much of a response body is read.
_MAX_RESPONSE_BYTES = 64 << 10
# RFC 9110 token characters, for header names.
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

_log = logging.getLogger("otelcol_llm_hook")
# Failures are logged at most this often, so a down collector cannot flood
# the engine's log.
_LOG_EVERY_SECONDS = 60.0

_HEX = frozenset("0123456789abcdefABCDEF")

# Queue items are tuples; the first element says which event it is.
_START, _TOKEN, _END, _SHARE = 0, 1, 2, 3


def _dumps(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _encode_line(obj):
    """Encode one event dict as a UTF-8 NDJSON line ending in a newline."""
    try:
        return (_dumps(obj) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate cannot be written as UTF-8; JSON's \u escapes can
        # carry it (the receiver turns it into U+FFFD).
        return (json.dumps(obj, separators=(",", ":")) + "\n").encode("ascii")


def _check_session_id(session_id, name="session_id"):
    if type(session_id) is not str or not session_id:
        raise ValueError("%s: want a non-empty str, got %r" % (name, type(session_id).__name__))
    # 64 characters are at most 256 bytes of UTF-8; only longer ids need counting.
    if len(session_id) > MAX_SESSION_ID_BYTES // 4:
        n = len(session_id.encode("utf-8", "surrogatepass"))
        if n > MAX_SESSION_ID_BYTES:
            raise ValueError("%s: %d bytes, limit is %d" % (name, n, MAX_SESSION_ID_BYTES))


def _check_time(t):
    if t is None:
        return time.time_ns()
    if type(t) is not int or t <= 0 or t > _MAX_INT64:
        raise ValueError("time_unix_nano: want a positive int of nanoseconds, got %r" % (t,))
    return t


def _check_uint(name, v):
    if v is None:
        return None
    if type(v) is not int or v < 0 or v > _MAX_INT64:
        raise ValueError("%s: want a non-negative int, got %r" % (name, v))
    return v


def _check_str(name, v):
    """Return v, or None for an unset value; an empty string counts as unset."""
    if v is None or v == "":
        return None
    if type(v) is not str:
        raise ValueError("%s: want a str, got %s" % (name, type(v).__name__))
    return v


def _check_hex_id(name, v, digits):
    """Return the id as lowercase hex; v is a hex str or an int (as OTel's SpanContext holds it)."""
    if v is None:
        return None
    if type(v) is int:
        if v <= 0 or v >= 1 << (4 * digits):
            raise ValueError("%s: int out of range for %d hex digits" % (name, digits))
        return "%0*x" % (digits, v)
    if type(v) is not str:
        raise ValueError("%s: want a str of %d hex digits, got %s" % (name, digits, type(v).__name__))
    if len(v) != digits:
        raise ValueError("%s: want %d hex digits, got %d" % (name, digits, len(v)))
    if not _HEX.issuperset(v):
        raise ValueError("%s: want %d hex digits, got %r" % (name, digits, v))
    if v.strip("0") == "":
        raise ValueError("%s: must not be all zeros" % (name,))
    return v.lower()


def _set(ev, key, v):
    """Put an optional field into ev unless it is unset (None)."""
    if v is not None:
        ev[key] = v


def _check_operation(v):
    if v is not None and v not in OPERATIONS:
        raise ValueError("operation: want chat or text_completion, got %r" % (v,))
    return v


def _check_headers(headers):
    """Return the headers to send, Content-Type set; raise ValueError for what could not be sent."""
    hdrs = {}
    for k, v in (headers or {}).items():
        if type(k) is not str or type(v) is not str:
            raise ValueError("headers: want str keys and values")
        if not k or not _TOKEN_CHARS.issuperset(k):
            raise ValueError("headers: invalid header name %r" % (k,))
        if any(c in v for c in "\r\n\0"):
            raise ValueError("headers: %s: value holds a line break or NUL" % (k,))
        if k.lower() != "content-type":
            hdrs[k] = v
    hdrs["Content-Type"] = "application/x-ndjson"
    return hdrs


def _retry_after(headers):
    """Return a Retry-After in whole seconds, or None when there is none."""
    v = (headers.get("Retry-After") or "").strip() if headers is not None else ""
    return min(int(v), 3600) if v.isdigit() and v.isascii() else None


def _rejected_count(payload, n):
    """The "rejected" count of a receiver answer, within 0..n; 0 for any other body."""
    try:
        r = json.loads(payload)
    except ValueError:
        return 0, None
    if not isinstance(r, dict) or type(r.get("rejected")) is not int:
        return 0, None
    return min(max(r["rejected"], 0), n), r


def _stated_limit(verdict, key):
    """A positive int the answer's "limits" state under key, or None.

    The receiver states its limits ({"max_lines_per_batch": N,
    "max_line_bytes": M, "max_request_body_size": B}) when a batch broke one.
    """
    limits = verdict.get("limits") if isinstance(verdict, dict) else None
    v = limits.get(key) if isinstance(limits, dict) else None
    return v if type(v) is int and v > 0 else None


def _check_attributes(attributes):
    if attributes is None:
        return None
    try:
        items = list(attributes.items())
    except AttributeError:
        raise ValueError("attributes: want a mapping of str to str, got %s" % type(attributes).__name__) from None
    if not items:
        return None
    if len(items) > MAX_ATTRIBUTES:
        raise ValueError("attributes: %d entries, limit is %d" % (len(items), MAX_ATTRIBUTES))
    for k, v in items:
        if type(k) is not str or not k:
            raise ValueError("attributes: keys must be non-empty str, got %r" % (k,))
        if len(k) > MAX_ATTRIBUTE_KEY_BYTES // 4:
            n = len(k.encode("utf-8", "surrogatepass"))
            if n > MAX_ATTRIBUTE_KEY_BYTES:
                raise ValueError("attributes: key %r: %d bytes, limit is %d" % (k[:64], n, MAX_ATTRIBUTE_KEY_BYTES))
        if type(v) is not str:
            raise ValueError("attributes.%s: want a str, got %s" % (k, type(v).__name__))
    # A copy, so later changes by the caller do not leak into the queued event.
    return dict(items)


def node_endpoint():
    """The endpoint of the node's collector, what an empty endpoint stands for.

    Its Unix socket (DEFAULT_UNIX_SOCKET) when the socket's directory exists,
    which is how the node agent offers it (the directory is its hostPath,
    mounted into the engine's pod; the socket itself may come and go with
    collector restarts); otherwise its UDP port on loopback.
    """
    if os.path.isdir(os.path.dirname(DEFAULT_UNIX_SOCKET)):
        return "unix://" + DEFAULT_UNIX_SOCKET
    return "udp://127.0.0.1:%d" % DEFAULT_UDP_PORT


def _parse_endpoint(endpoint):
    """Return (transport, target): ("unix", path), ("udp", (host, port)) or ("http", url)."""
    if endpoint is None or endpoint == "":
        endpoint = node_endpoint()
    if type(endpoint) is not str:
        raise ValueError("endpoint: want a str, got %s" % type(endpoint).__name__)
    u = urllib.parse.urlsplit(endpoint)
    scheme = u.scheme.lower()
    if scheme == "unix":
        if u.netloc or u.query or u.fragment:
            raise ValueError("endpoint %r: a unix endpoint is an absolute path only, as unix:///run/otelcol-llm/hooks.sock"
                             % (endpoint,))
        if not u.path.startswith("/"):
            raise ValueError("endpoint %r: missing the socket's path" % (endpoint,))
        if len(u.path.encode("utf-8", "surrogatepass")) > _MAX_UNIX_PATH_BYTES:
            raise ValueError("endpoint %r: a socket path holds at most %d bytes" % (endpoint, _MAX_UNIX_PATH_BYTES))
        return "unix", u.path
    try:
        port = u.port
    except ValueError as e:
        raise ValueError("endpoint %r: %s" % (endpoint, e)) from None
    if not u.hostname:
        raise ValueError("endpoint %r: no host" % (endpoint,))
    if scheme == "udp":
        if u.path not in ("", "/") or u.query or u.fragment:
            raise ValueError("endpoint %r: a udp endpoint is udp://host:port" % (endpoint,))
        return "udp", (u.hostname, port or DEFAULT_UDP_PORT)
    if scheme in ("http", "https"):
        netloc = u.netloc
        if port is None:
            netloc = "%s:%d" % (netloc, DEFAULT_HTTP_PORT)
        path = u.path if u.path not in ("", "/") else DEFAULT_HTTP_PATH
        return "http", urllib.parse.urlunsplit((scheme, netloc, path, u.query, ""))
    raise ValueError("endpoint %r: scheme must be unix, udp, http or https" % (endpoint,))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A redirect would turn the POST into a GET without a body; treat it as an error.
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class Client:
    """A non-blocking sender of token events.

    endpoint: ``unix:///path/to/hooks.sock`` (the receiver's hooks::unix: one
    stream connection, the cheapest for the collector), ``udp://host[:port]``
    (port defaults to 4321) or ``http(s)://host[:port][/path]`` (port
    defaults to 4320, path to ``/v1/token-events``). None or "" is the
    node's collector, ``node_endpoint()``: its socket where the node offers
    it, UDP on loopback otherwise.
    queue_size: events held while the sender thread catches up; beyond it
    events are dropped and counted.
    flush_interval: seconds an event may wait for its batch to fill up.
    max_batch_bytes: the largest HTTP body or UDP datagram (default 1 MiB for
    HTTP, 8 KiB for UDP). Batches hold whole lines; a line longer than this
    is not sent and counts as rejected.
    headers: extra HTTP headers, e.g. an Authorization header (never logged).
    HTTP only.
    request_timeout: seconds one HTTP request may wait for each step
    (connect, send, each read); default 5. Over a Unix socket: connecting,
    each write, and close's wait for the acknowledgements of the lines in
    flight.
    max_batch_lines: the most lines (events) in one HTTP body or UDP
    datagram; default 10 000, the receiver's default max_lines_per_batch
    (it reads no more lines of a batch and rejects the rest). Set the
    receiver's value when it is configured lower. Over HTTP, limits the
    receiver states in its answer to a batch that broke one (lines, line
    bytes, body bytes) lower the client's bounds; they never raise them.

    ``start``/``token``/``end`` raise ValueError for invalid arguments (a bad
    trace_id, a negative count, ...), send nothing then, and never block.
    ``stats()`` counts the events taken, each in one of: ``sent`` (handed to
    UDP, or accepted by the receiver; over a Unix socket once its
    acknowledgement says so, until then the event is in flight), ``dropped`` (queue full, client
    closed), ``failed`` (the send failed: transport error, timeout, non-2xx
    status) and ``rejected`` (lines the receiver reported as rejected, or too
    long to send). The contract shared with the Go client: hooks/README.md.
    """

    def __init__(self, endpoint=None, queue_size=65536, flush_interval=0.1, max_batch_bytes=None, headers=None,
                 *, request_timeout=None, max_batch_lines=None):
        self._transport, self._target = _parse_endpoint(endpoint)
        if type(queue_size) is not int or queue_size < 1:
            raise ValueError("queue_size: want a positive int, got %r" % (queue_size,))
        if not isinstance(flush_interval, (int, float)) or isinstance(flush_interval, bool) or not flush_interval > 0:
            raise ValueError("flush_interval: want a positive number of seconds, got %r" % (flush_interval,))
        if max_batch_bytes is None:
            max_batch_bytes = {"udp": DEFAULT_UDP_BATCH_BYTES, "unix": DEFAULT_UNIX_BATCH_BYTES}.get(
                self._transport, DEFAULT_HTTP_BATCH_BYTES)
        if type(max_batch_bytes) is not int or max_batch_bytes < 64:
            raise ValueError("max_batch_bytes: want an int of at least 64, got %r" % (max_batch_bytes,))
        if self._transport == "udp" and max_batch_bytes > MAX_UDP_DATAGRAM_BYTES:
            raise ValueError("max_batch_bytes: %d exceeds the largest UDP datagram (%d)"
                             % (max_batch_bytes, MAX_UDP_DATAGRAM_BYTES))
        if max_batch_lines is None:
            max_batch_lines = DEFAULT_MAX_BATCH_LINES
        if type(max_batch_lines) is not int or max_batch_lines < 1:
            raise ValueError("max_batch_lines: want a positive int, got %r" % (max_batch_lines,))
        if self._transport == "udp":
            # Settings a UDP endpoint would silently ignore are mistakes: an
            # Authorization header that is never sent, for one.
            if headers:
                raise ValueError("headers: set, but a udp:// endpoint sends no headers")
            if request_timeout is not None:
                raise ValueError("request_timeout: set, but a udp:// endpoint has no requests to time")
        if self._transport == "unix" and headers:
            raise ValueError("headers: set, but a unix:// endpoint sends no headers")
        if request_timeout is None:
            request_timeout = DEFAULT_REQUEST_TIMEOUT
        if not isinstance(request_timeout, (int, float)) or isinstance(request_timeout, bool) \
                or not request_timeout > 0:
            raise ValueError("request_timeout: want a positive number of seconds, got %r" % (request_timeout,))
        self._headers = _check_headers(headers)
        self._queue_size = queue_size
        self._flush_interval = float(flush_interval)
        # The bounds of a batch and of its lines, lowered to those the
        # receiver states (_adopt_limits); only the sender thread uses them.
        self._max_batch_bytes = max_batch_bytes
        self._max_batch_lines = max_batch_lines
        self._max_line_bytes = min(MAX_LINE_BYTES + 1, max_batch_bytes)  # with its newline
        self._request_timeout = float(request_timeout)
        # The collector runs next to the engine: never route it through an
        # HTTP(S)_PROXY meant for outside traffic.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)

        self._sent = self._dropped = self._failed = self._rejected = 0
        self._closed = False
        self._init_runtime()
        _live_clients.add(self)

    # -- the caller's side: validate, enqueue, return ------------------------

    def start(self, session_id, time_unix_nano=None, *, trace_id=None, span_id=None, parent_span_id=None,
              model=None, operation=None, prompt_tokens=None, engine=None, attributes=None, stream=True,
              tracestate=None):
        """Record that the engine received a request (a session starts).

        ``stream=False`` marks a request that asked for one whole response
        (no TTFT or gaps to time); ``tracestate`` is the caller's W3C
        tracestate header, whose sampling entries the collector honours.
        """
        _check_session_id(session_id)
        t = _check_time(time_unix_nano)
        ev = {"event": "start", "session_id": session_id, "time_unix_nano": t}
        # Optional fields in the order the Go encoder writes them.
        _set(ev, "trace_id", _check_hex_id("trace_id", trace_id, 32))
        _set(ev, "span_id", _check_hex_id("span_id", span_id, 16))
        _set(ev, "parent_span_id", _check_hex_id("parent_span_id", parent_span_id, 16))
        _set(ev, "model", _check_str("model", model))
        _set(ev, "operation", _check_operation(operation))
        _set(ev, "prompt_tokens", _check_uint("prompt_tokens", prompt_tokens))
        _set(ev, "engine", _check_str("engine", engine))
        _set(ev, "attributes", _check_attributes(attributes))
        if type(stream) is not bool:
            raise ValueError("stream: want a bool, got %r" % (stream,))
        if not stream:
            ev["stream"] = False
        ts = _check_str("tracestate", tracestate)
        if ts is not None and (len(ts) > MAX_TRACESTATE_BYTES or not all(" " <= ch <= "~" for ch in ts)):
            raise ValueError("tracestate: want at most %d printable ASCII characters" % MAX_TRACESTATE_BYTES)
        _set(ev, "tracestate", ts)
        self._put((_START, ev))

    def token(self, session_id, time_unix_nano=None, count=1, *, seq=None):
        """Record a streamed chunk of ``count`` tokens.

        ``seq`` numbers the session's token events (0, 1, 2, ...): a retried
        event is then folded once.
        """
        if type(session_id) is not str or not session_id or len(session_id) > MAX_SESSION_ID_BYTES // 4:
            _check_session_id(session_id)
        if time_unix_nano is None:
            time_unix_nano = time.time_ns()
        elif type(time_unix_nano) is not int or time_unix_nano <= 0 or time_unix_nano > _MAX_INT64:
            _check_time(time_unix_nano)
        if type(count) is not int or count < 1 or count > MAX_COUNT:
            raise ValueError("count: want an int from 1 to %d, got %r" % (MAX_COUNT, count))
        if seq is not None:
            _check_uint("seq", seq)
        self._put((_TOKEN, session_id, time_unix_nano, count, seq))

    def end(self, session_id, time_unix_nano=None, *, completion_tokens=None, finish_reason=None, error=None,
            response_model=None, queue_time_ns=None, prefill_time_ns=None, decode_time_ns=None,
            engine_time_prefill_ns=None, engine_time_decode_ns=None, energy_mj=None):
        """Record that a session ended; ``error`` is an error type, e.g. an exception class name.

        ``queue_time_ns``, ``prefill_time_ns`` and ``decode_time_ns`` are the
        engine's own split of the request's time (queued to scheduled,
        scheduled to first token, first to last token), when it knows it.

        ``engine_time_prefill_ns`` and ``engine_time_decode_ns`` are the
        request's share of the engine's busy time, for an engine that sees
        its steps: each step's time split among its requests by the tokens
        each computed in it (``token_session`` then reports it as it came,
        ``llm.session.attribution_source=engine``); ``energy_mj`` its share
        of the GPU's energy, in millijoules, sent only with the engine time.
        """
        _check_session_id(session_id)
        t = _check_time(time_unix_nano)
        ev = {"event": "end", "session_id": session_id, "time_unix_nano": t}
        _set(ev, "completion_tokens", _check_uint("completion_tokens", completion_tokens))
        _set(ev, "finish_reason", _check_str("finish_reason", finish_reason))
        _set(ev, "error", _check_str("error", error))
        _set(ev, "response_model", _check_str("response_model", response_model))
        _set(ev, "queue_time_ns", _check_uint("queue_time_ns", queue_time_ns))
        _set(ev, "prefill_time_ns", _check_uint("prefill_time_ns", prefill_time_ns))
        _set(ev, "decode_time_ns", _check_uint("decode_time_ns", decode_time_ns))
        prefill = _check_uint("engine_time_prefill_ns", engine_time_prefill_ns)
        decode = _check_uint("engine_time_decode_ns", engine_time_decode_ns)
        energy = _check_uint("energy_mj", energy_mj)
        if prefill is not None or decode is not None:
            # The receiver takes a part not given as 0; the two go together.
            ev["engine_time_prefill_ns"] = prefill or 0
            ev["engine_time_decode_ns"] = decode or 0
            _set(ev, "energy_mj", energy)
        elif energy is not None:
            raise ValueError("energy_mj: sent only with engine_time_prefill_ns or engine_time_decode_ns")
        self._put((_END, ev))

    def share(self, engine_request_id, time_unix_nano=None, *, engine=None, engine_time_prefill_ns=0,
              engine_time_decode_ns=0, energy_mj=None):
        """Record a request's share of the engine's busy time, sent by the engine's scheduler, another process
        than the one that sends the request's session: ``engine_request_id`` is the engine's own id of the
        request, which the session's start names in its ``llm.engine.request_id`` attribute, and the collector
        joins the share to that session. The parts are as on ``end``: each step's time split among its requests by
        the tokens each computed in it, prefill and decode, in ns; ``energy_mj`` its share of the GPU's energy.
        """
        _check_session_id(engine_request_id, "engine_request_id")
        t = _check_time(time_unix_nano)
        ev = {"event": "share", "engine_request_id": engine_request_id, "time_unix_nano": t}
        _set(ev, "engine", _check_str("engine", engine))
        ev["engine_time_prefill_ns"] = _check_uint("engine_time_prefill_ns", engine_time_prefill_ns) or 0
        ev["engine_time_decode_ns"] = _check_uint("engine_time_decode_ns", engine_time_decode_ns) or 0
        _set(ev, "energy_mj", _check_uint("energy_mj", energy_mj))
        self._put((_SHARE, ev))

    def _put(self, item):
        with self._lock:
            if self._closed:
                self._dropped += 1
                return
            q = self._q
            n = len(q)
            if n >= self._queue_size:
                self._dropped += 1
                return
            q.append(item)
            self._enqueued += 1
            if self._thread is None:
                self._start_thread()
        # Outside the lock: Event.set takes its own lock, and is needed only
        # when the sender may be asleep on an empty queue or the queue is
        # filling up.
        if n == 0:
            self._has_data.set()
        elif n == self._high_water:
            self._urgent.set()

    # -- control ---------------------------------------------------------------

    def flush(self, timeout=5.0):
        """Send what is queued now, waiting up to ``timeout`` seconds.

        Returns True when every event queued before the call was sent,
        failed or dropped; False on timeout. Call it from shutdown or test
        code, not from the token loop: it blocks.
        """
        deadline = time.monotonic() + timeout
        with self._lock:
            target = self._enqueued
            thread = self._thread
        if thread is None:
            return self._done >= target
        self._urgent.set()
        with self._done_cond:
            while self._done < target:
                left = deadline - time.monotonic()
                if left <= 0 or not thread.is_alive():
                    return self._done >= target
                self._done_cond.wait(left)
        # Over a Unix socket, what was written is in flight until
        # acknowledged.
        stream = self._stream
        return stream is None or stream.settled(deadline - time.monotonic())

    def close(self, timeout=5.0):
        """Send what is queued and stop the sender thread. Idempotent.

        Events recorded after close are dropped and counted.
        """
        with self._lock:
            self._closed = True
            thread = self._thread
        self._has_data.set()
        self._urgent.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        _live_clients.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def stats(self):
        """Event counts: sent, dropped, failed, rejected."""
        with self._lock:
            return {"sent": self._sent, "dropped": self._dropped, "failed": self._failed,
                    "rejected": self._rejected}

    # -- the sender thread -----------------------------------------------------

    def _init_runtime(self):
        # Everything a forked child must not share with its parent.
        self._lock = threading.Lock()
        self._q = deque()
        self._enqueued = 0
        self._done = 0
        self._done_cond = threading.Condition(threading.Lock())
        self._has_data = threading.Event()  # set: the queue may hold events
        self._urgent = threading.Event()  # set: send now (flush, close, queue half full)
        self._high_water = max(1, self._queue_size // 2)
        self._sock = None
        self._udp_addr = None
        self._stream = None  # the Unix socket connection, if open
        self._next_dial = 0.0
        self._backoff = 0.0
        self._last_log = None
        self._thread = None
        if not self._closed:
            self._start_thread()

    def _start_thread(self):
        t = threading.Thread(target=self._run, name="otelcol-llm-hook", daemon=True)
        self._thread = t
        t.start()

    def _after_fork_in_child(self):
        # The sender thread does not survive a fork; the parent sends what it
        # had queued. The child starts its own thread on its first event.
        if self._sock is not None:
            self._sock.close()  # the child's copy of the parent's socket
        if self._stream is not None:
            # close, not shutdown: shutdown would end the parent's connection.
            self._stream.sock.close()
        closed = self._closed
        self._closed = True
        self._init_runtime()
        self._closed = closed

    def _run(self):
        try:
            while True:
                self._has_data.wait()
                if not self._urgent.is_set() and not self._closed:
                    self._urgent.wait(self._flush_interval)
                self._urgent.clear()
                with self._lock:
                    items, self._q = self._q, deque()
                    closed = self._closed
                    if not closed:
                        self._has_data.clear()
                if items:
                    try:
                        self._send_items(items)
                    except Exception as e:  # never let the thread die silently
                        self._count(failed=len(items))
                        self._log_failure("sending %d events failed: %s" % (len(items), type(e).__name__))
                    with self._done_cond:
                        self._done += len(items)
                        self._done_cond.notify_all()
                elif closed:
                    break
        finally:
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            if self._stream is not None:
                self._stream.finish(self._request_timeout)
            with self._done_cond:
                self._done_cond.notify_all()

    def _send_items(self, items):
        # Re-read after each batch sent: its answer may have lowered them.
        limit, max_lines, max_line = self._max_batch_bytes, self._max_batch_lines, self._max_line_bytes
        batch = []
        size = 0
        too_long = 0
        # Token lines are most of the traffic: they are formatted from a
        # per-session prefix instead of a json.dumps call each, byte for byte
        # what _encode_line would write.
        prefixes = {}
        for item in items:
            if item[0] == _TOKEN:
                _, sid, t, count, seq = item
                prefix = prefixes.get(sid)
                if prefix is None:
                    prefix = _encode_line({"event": "token", "session_id": sid, "time_unix_nano": 0})[:-3]
                    prefixes[sid] = prefix
                if count == 1 and seq is None:
                    line = prefix + b"%d}\n" % t
                elif seq is None:
                    line = prefix + b'%d,"count":%d}\n' % (t, count)
                elif count == 1:
                    line = prefix + b'%d,"seq":%d}\n' % (t, seq)
                else:
                    line = prefix + b'%d,"count":%d,"seq":%d}\n' % (t, count, seq)
            else:
                line = _encode_line(item[1])
            n = len(line)
            if batch and (len(batch) >= max_lines or size + n > limit):
                self._send_batch(batch, size)
                batch = []
                size = 0
                limit, max_lines, max_line = self._max_batch_bytes, self._max_batch_lines, self._max_line_bytes
            if n > max_line:
                too_long += 1
                continue
            batch.append(line)
            size += n
        if batch:
            self._send_batch(batch, size)
        if too_long:
            # The receiver would reject them, or no batch can hold them.
            self._count(rejected=too_long)
            self._log_failure("rejected %d events longer than %d bytes" % (too_long, self._max_line_bytes - 1))

    def _send_batch(self, lines, size):
        body = b"".join(lines)
        if self._transport == "unix":
            self._send_unix(body, len(lines))
        elif self._transport == "udp":
            self._send_udp(body, len(lines))
        else:
            self._send_http(body, len(lines))

    def _send_udp(self, body, n):
        try:
            if self._sock is None:
                host, port = self._target
                family, _, _, _, addr = socket.getaddrinfo(host, port, 0, socket.SOCK_DGRAM)[0]
                sock = socket.socket(family, socket.SOCK_DGRAM)
                sock.settimeout(1.0)
                self._sock, self._udp_addr = sock, addr
            self._sock.sendto(body, self._udp_addr)
        except OSError as e:
            # Drop the socket so the next batch resolves the address again.
            if self._sock is not None:
                self._sock.close()
                self._sock = None
            self._count(failed=n)
            self._log_failure("UDP send of %d events failed: %s" % (n, e.__class__.__name__))
            return
        self._count(sent=n)

    def _send_unix(self, body, n):
        """Write a batch on the Unix socket: its lines are in flight until acknowledged.

        No connection and none to be made (the collector is down, or the
        backoff since the last failed connect has not passed): the batch
        fails at once, so the engine never waits for a collector.
        """
        stream = self._stream
        if stream is not None and stream.ended:
            stream = self._stream = None
        if stream is None:
            now = time.monotonic()
            if now < self._next_dial:
                self._count(failed=n)
                return
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self._request_timeout)
            try:
                sock.connect(self._target)
            except OSError as e:
                sock.close()
                self._backoff = min(max(2 * self._backoff, _FIRST_REDIAL_SECONDS), _LAST_REDIAL_SECONDS)
                self._next_dial = now + self._backoff
                self._count(failed=n)
                self._log_failure("connecting to %s failed: %s" % (self._target, e.__class__.__name__))
                return
            self._backoff = 0.0
            stream = self._stream = _Stream(self, sock)
        if not stream.take(n):
            self._stream = None
            self._count(failed=n)
            return
        try:
            stream.sock.sendall(body)
        except OSError as e:
            # Some lines may have arrived: those acknowledged count as the
            # acknowledgement says, the others fail when the reader ends.
            stream.abort()
            self._stream = None
            self._log_failure("writing %d events failed: %s" % (n, e.__class__.__name__))

    def _send_http(self, body, n):
        """POST a batch and count the receiver's verdict, as the Go client does.

        The lines the answer names as rejected are rejected, whatever the
        status; the others are sent on a 2xx and failed otherwise, as after a
        transport error. A 503 with a Retry-After of at most one second is
        retried once after that delay.
        """
        for attempt in (0, 1):
            try:
                status, headers, payload = self._post(body)
            except (OSError, ValueError, http.client.HTTPException) as e:  # URLError, timeouts, resets
                self._count(failed=n)
                self._log_failure("HTTP POST of %d events failed: %s" % (n, e.__class__.__name__))
                return
            rejected, verdict = _rejected_count(payload, n)
            self._adopt_limits(verdict)
            if 200 <= status < 300:
                self._count(sent=n - rejected, rejected=rejected)
                if rejected:
                    self._log_failure("collector rejected %d of %d events%s" % (rejected, n, _first_error(verdict)))
                return
            retry_after = _retry_after(headers)
            if status == 503 and attempt == 0 and retry_after is not None and retry_after <= MAX_RETRY_AFTER_SECONDS:
                time.sleep(retry_after)
                continue
            self._count(failed=n - rejected, rejected=rejected)
            self._log_failure("HTTP POST of %d events failed: status %d%s" % (n, status, _first_error(verdict)))
            return

    def _adopt_limits(self, verdict):
        """Lower the bounds of the next batches to the limits the receiver states.

        It states them when a batch broke one: a receiver configured below
        the defaults costs one batch's excess, not every batch's. The bounds
        are never raised.
        """
        v = _stated_limit(verdict, "max_lines_per_batch")
        if v is not None:
            self._max_batch_lines = min(self._max_batch_lines, v)
        v = _stated_limit(verdict, "max_request_body_size")
        if v is not None:
            self._max_batch_bytes = min(self._max_batch_bytes, v)
        v = _stated_limit(verdict, "max_line_bytes")
        if v is not None:
            self._max_line_bytes = min(self._max_line_bytes, v + 1)
        self._max_line_bytes = min(self._max_line_bytes, self._max_batch_bytes)

    def _post(self, body):
        """Make one request; return (status, headers, body) for any status."""
        req = urllib.request.Request(self._target, data=body, headers=self._headers, method="POST")
        try:
            with self._opener.open(req, timeout=self._request_timeout) as resp:
                return resp.status, resp.headers, resp.read(_MAX_RESPONSE_BYTES)
        except urllib.error.HTTPError as e:
            with e:
                return e.code, e.headers, e.read(_MAX_RESPONSE_BYTES)

    def _count(self, sent=0, dropped=0, failed=0, rejected=0):
        with self._lock:
            self._sent += sent
            self._dropped += dropped
            self._failed += failed
            self._rejected += rejected

    def _log_failure(self, msg):
        now = time.monotonic()
        if self._last_log is None or now - self._last_log >= _LOG_EVERY_SECONDS:
            self._last_log = now
            s = self.stats()
            _log.warning("otelcol-llm hook: %s (totals: sent %d, dropped %d, failed %d, rejected %d)",
                         msg, s["sent"], s["dropped"], s["failed"], s["rejected"])


class _Stream:
    """One Unix socket connection and the lines in flight on it.

    A thread of its own reads the receiver's acknowledgements,
    ``{"accepted":N,"rejected":M,"refused":K,"errors":[...]}`` a batch of
    lines, and settles the lines in flight: accepted as sent, rejected as
    rejected, refused (the pipeline refused them) as failed. When the
    connection ends, the lines no acknowledgement covered count as failed:
    a collector restart loses at most those, and counts them.
    """

    def __init__(self, client, sock):
        self.client = client
        self.sock = sock
        self.in_flight = 0
        self.ended = False
        self.cond = threading.Condition(threading.Lock())
        self.thread = threading.Thread(target=self._read_acks, name="otelcol-llm-hook-acks", daemon=True)
        self.thread.start()

    def take(self, n):
        """Count n lines about to be written as in flight; False if the connection has ended."""
        with self.cond:
            if self.ended:
                return False
            self.in_flight += n
            return True

    def settled(self, timeout):
        """Wait up to timeout seconds until nothing is in flight."""
        deadline = time.monotonic() + max(timeout, 0)
        with self.cond:
            while self.in_flight and not self.ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    def abort(self):
        """End the connection at once; the reader counts what is in flight as failed."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def finish(self, timeout):
        """Close the write side, so that the receiver hands over and acknowledges what it read, and wait up to
        timeout seconds for that; then what is still in flight counts as failed."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        self.thread.join(timeout)
        if self.thread.is_alive():
            self.abort()
            self.thread.join()

    def _read_acks(self):
        buf = b""
        try:
            while True:
                try:
                    chunk = self.sock.recv(65536)
                except socket.timeout:
                    continue  # idle: the socket's timeout is the writes'
                if not chunk:
                    break
                buf += chunk
                if len(buf) > _MAX_ACK_BYTES and b"\n" not in buf:
                    break  # not our receiver
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not self._settle(line):
                        return
        except (OSError, ValueError):
            pass
        finally:
            with self.cond:
                self.ended = True
                lost, self.in_flight = self.in_flight, 0
                self.cond.notify_all()
            self.client._count(failed=lost)
            if lost:
                self.client._log_failure("connection to the collector ended with %d events unacknowledged" % lost)
            self.sock.close()

    def _settle(self, line):
        try:
            ack = json.loads(line)
            accepted, rejected, refused = (int(ack.get(k, 0)) for k in ("accepted", "rejected", "refused"))
        except (ValueError, TypeError, AttributeError):
            return False  # not our receiver: what is in flight cannot be told
        if min(accepted, rejected, refused) < 0:
            return False
        with self.cond:
            # An acknowledgement covers no more than is in flight.
            n = min(accepted + rejected + refused, self.in_flight)
            self.in_flight -= n
            sent = min(accepted, n)
            rej = min(rejected, n - sent)
            self.cond.notify_all()
        self.client._count(sent=sent, rejected=rej, failed=n - sent - rej)
        if rej:
            self.client._log_failure("collector rejected %d events%s" % (rej, _first_error(ack)))
        return True


def _first_error(verdict):
    """": line N: message" of a receiver answer's first line error, or ""; it names a line and field, never text."""
    errs = verdict.get("errors") if verdict else None
    if isinstance(errs, list) and errs and isinstance(errs[0], dict):
        return ": line %s: %s" % (errs[0].get("line"), str(errs[0].get("message"))[:200])
    return ""


# Clients still open, for fork and interpreter exit handling; weak so they
# can be garbage collected.
_live_clients = weakref.WeakSet()


def _reinit_after_fork():
    for c in list(_live_clients):
        c._after_fork_in_child()


def _close_at_exit():
    # The sender is a daemon thread: without this, events queued at exit are lost.
    for c in list(_live_clients):
        c.close(timeout=1.0)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reinit_after_fork)
atexit.register(_close_at_exit)
