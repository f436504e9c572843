"""otelcol-llm inside vLLM: token events from vLLM's own server, without editing vLLM.

Installed with the hook (``pip install ./hooks/python``), this module is a vLLM *general plugin*: the package
registers ``register`` in the entry point group ``vllm.general_plugins`` (name ``otelcol_llm``), which vLLM loads in
each of its processes at start (``vllm/plugins/__init__.py``, ``load_general_plugins``). It does nothing unless
``OTELCOL_LLM_HOOK_ENDPOINT`` is set (e.g. ``unix:///run/otelcol-llm/hooks.sock``): installing it never changes
vLLM's behaviour on its own.

With the endpoint set, it wraps three methods of vLLM V1's output processor (``vllm/v1/engine/output_processor.py``),
which runs in the API server process and sees every output of every engine step:

- ``OutputProcessor.add_request``: a request enters; the plugin sends its ``start`` (arrival time, prompt length,
  the request's trace context, its conversation, whether it streams);
- ``RequestState.make_request_output``: every ``RequestOutput`` vLLM makes for a request; the plugin sends a
  ``token`` event with the number of tokens the output adds, and with the last one the ``end``: finish reason,
  completion tokens, and the engine's own split of the request's time from its ``RequestStateStats``;
- ``OutputProcessor.abort_requests``: the end of an aborted request that got no abort output (the offline
  ``LLMEngine`` makes none).

vLLM's internals are not a stable API, so the plugin is built never to harm vLLM, whatever vLLM becomes:

- ``register()`` and ``install()`` never raise. A target that is missing, is not a plain function, or lacks a
  parameter the plugin reads is refused: logged once, counted in ``stats()["refused"]``, left untouched. The plugin
  patches nothing unless both ``add_request`` and ``make_request_output`` can be patched (a start without its end
  would read as a session that timed out).
- Each wrapper passes ``*args, **kwargs`` through unchanged, calls the original exactly once and returns what it
  returns (its exceptions are vLLM's own and go through untouched); all the plugin's own work runs after, under a
  guard: anything failing there is counted in ``stats()["errors"]`` and logged once, and vLLM goes on.
- The plugin keeps its per-request state beside vLLM's objects (weak references), never on them.
- Sending never blocks: the hook's client queues and drops (counted) when full.

The README (``hooks/python/README.md``) lists the vLLM commits this was checked against and the signatures it
expects.

Settings (environment):

- ``OTELCOL_LLM_HOOK_ENDPOINT``: the collector's hook endpoint: ``unix:///path/to/hooks.sock`` (the node agent's
  socket, the cheapest for the collector: one stream connection, acknowledged), ``udp://host:port`` or
  ``http(s)://host:port``; ``node`` is the node's collector (``otelcol_llm_hook.node_endpoint()``: its socket where
  the node offers it, UDP on loopback otherwise); unset, the plugin is off;
- ``OTELCOL_LLM_HOOK_MODEL``: the model name to report (vLLM's output processor does not know the served name);
- ``OTELCOL_LLM_HOOK_ENGINE``: the engine instance's name (default ``vllm-<hostname>``);
- ``OTELCOL_LLM_HOOK_OPERATION``: ``chat`` (default) or ``text_completion``.
"""

import enum
import functools
import hashlib
import logging
import os
import socket
import threading
import time
import weakref

import otelcol_llm_vllm_patching as patching

__all__ = ["register", "install", "stats", "Observer", "TARGETS"]

# A child of vLLM's own logger, so that what the plugin says appears in vLLM's log, in vLLM's format.
_log = logging.getLogger("vllm.plugins.otelcol_llm")

ENV_ENDPOINT = "OTELCOL_LLM_HOOK_ENDPOINT"
# The value of ENV_ENDPOINT that stands for the node's collector, wherever it listens.
NODE_ENDPOINT = "node"
ENV_RUST_FRONTEND = "VLLM_USE_RUST_FRONTEND"
# Whether the engine core sends each request's exact share of the engine's time (otelcol_llm_vllm_steps), and the
# sessions' starts name vLLM's internal request id for the collector to join it: "1" or "0".
ENV_ENGINE_SHARE = "OTELCOL_LLM_HOOK_ENGINE_SHARE"
ENGINE_SHARE_DEFAULT = True
# The start attribute that names vLLM's internal request id: the id the engine core's share carries.
ENGINE_REQUEST_ID_ATTRIBUTE = "llm.engine.request_id"

# The collector's limit on a session id (bytes of UTF-8).
_MAX_SESSION_ID_BYTES = 256
# The start attribute that carries vLLM's session_id: the conversation a request belongs to (GenAI semconv).
CONVERSATION_ATTRIBUTE = "gen_ai.conversation.id"
_MAX_ATTRIBUTE_BYTES = 256
# What vLLM streams to the client when a request finishes with FinishReason.ERROR (serving.py,
# _convert_generation_error_to_streaming_response): the end event carries it as the error type.
ENGINE_ERROR_TYPE = "InternalServerError"
# A sub-request of a streaming-input request that finishes with one of these is the end of one input chunk, not
# of the session: more input may follow.
_CHUNK_FINISHES = ("stop", "length", "repetition")


# What the plugin patches in vllm.v1.engine.output_processor. The parameters named here are the ones the plugin
# reads (by name, wherever vLLM passes them); any others may come and go.
TARGETS = (
    patching.Target("OutputProcessor", "add_request", ["request"], essential=True),
    patching.Target("RequestState", "make_request_output", ["finish_reason"], essential=True),
    patching.Target("OutputProcessor", "abort_requests", [], essential=False),
)


class _Record:
    """What the plugin knows of one request in flight: its session id, the tokens counted, whether its end went
    out."""

    __slots__ = ("session_id", "request_id", "index", "delta", "seen", "ended", "chunk_finish")

    def __init__(self, session_id, request_id, index, delta):
        self.session_id, self.request_id = session_id, request_id
        # What the request's outputs are read by, fixed for its life: its CompletionOutput's index, and whether
        # an output holds only the new tokens (DELTA) or all so far.
        self.index, self.delta = index, delta
        self.seen = 0
        self.ended = False
        self.chunk_finish = None  # the finish of a streaming-input request's last input chunk


class Observer:
    """Turns what vLLM's output processor does into hook events for one Client.

    Its methods take vLLM's own objects; they are called by the wrappers ``install`` puts on vLLM's classes, and
    can be called directly (tests, other engines shaped like vLLM). Each may raise on an object it does not know:
    the wrappers catch that and count it.
    """

    def __init__(self, client, *, model=None, engine=None, operation="chat", engine_request_ids=False):
        # client is a Client, or a function that makes one: then the client (and its sender thread) comes into
        # being with the first request, in the one vLLM process that has requests, not in every process that
        # loads the plugin.
        self._client = client
        self.model = model
        self.engine = engine
        self.operation = operation
        # Whether a start names vLLM's internal request id (for the engine core's share to join).
        self.engine_request_ids = engine_request_ids
        self.errors = 0
        self._lock = threading.Lock()
        self._warned = False
        # The requests in flight, beside vLLM's objects, never on them: by vLLM's internal request id and by
        # session id. A record leaves at its end; a request vLLM drops without an output that ends it (the
        # offline engine's abort, the last chunk of a streaming input) is ended when its RequestState goes.
        self._open = {}
        self._by_session = {}

    @property
    def client(self):
        c = self._client
        if callable(c) and not hasattr(c, "start"):
            with self._lock:
                if callable(self._client) and not hasattr(self._client, "start"):
                    self._client = self._client()
                c = self._client
        return c

    def has_client(self):
        return not (callable(self._client) and not hasattr(self._client, "start"))

    def in_flight(self):
        """How many requests the plugin holds a record of (they leave at their end)."""
        return len(self._open)

    def failed(self, where, exc):
        """Count a failure of the plugin's own work; the first is logged (the exception's class only: never a
        value, which could hold a request's content)."""
        with self._lock:
            self.errors += 1
            warn = not self._warned
            self._warned = True
        if warn:
            _log.warning("otelcol-llm vLLM plugin: %s failed (%s); vLLM goes on, the session may be incomplete "
                         "(further failures are counted, not logged)", where, type(exc).__name__)

    # -- the points the wrappers call ----------------------------------------

    def request_added(self, processor, request):
        """``OutputProcessor.add_request(request, …)`` returned: send the start of a new request. For a request
        that streams its input, a later chunk is no new session, and its final chunk may end it."""
        rid = request.request_id
        state = processor.request_states.get(rid)
        rec = self._open.get(rid)
        if rec is not None:
            if state is None:
                # The final input chunk of a streaming-input request whose engine side had already finished:
                # vLLM ended the request inside add_request, without another output.
                self._end(rec, None, rec.chunk_finish or "stop")
            return  # else: another input chunk of a request already started
        if state is None or getattr(request, "sampling_params", None) is None:
            return  # unknown, or a pooling request (embeddings): no tokens to time
        sid = self._session_id(state)
        kind = _kind_name(state.output_kind)  # required: without it the outputs cannot be counted right
        index = getattr(state, "request_index", 0)
        rec = _Record(sid, rid, index if isinstance(index, int) else 0, kind == "DELTA")
        weakref.finalize(state, self._state_gone, rec)  # first: a state that cannot be watched gets no session
        self._open[rid] = rec
        self._by_session[sid] = rec
        arrival = getattr(request, "arrival_time", None)
        t = int(arrival * 1e9) if isinstance(arrival, (int, float)) and arrival > 0 else None
        kwargs = {}
        traceparent, tracestate = _trace_headers(getattr(request, "trace_headers", None))
        if traceparent:
            kwargs["trace_id"], kwargs["parent_span_id"] = traceparent
        if tracestate:
            kwargs["tracestate"] = tracestate
        attributes = {}
        conversation = getattr(request, "session_id", None)
        if isinstance(conversation, str) and conversation and len(conversation.encode()) <= _MAX_ATTRIBUTE_BYTES:
            attributes[CONVERSATION_ATTRIBUTE] = conversation
        if self.engine_request_ids and isinstance(rid, str) and len(rid.encode()) <= _MAX_ATTRIBUTE_BYTES:
            attributes[ENGINE_REQUEST_ID_ATTRIBUTE] = rid
        if attributes:
            kwargs["attributes"] = attributes
        prompt_len = getattr(state, "prompt_len", None)
        self.client.start(
            sid, t, model=self.model, operation=self.operation,
            prompt_tokens=prompt_len if isinstance(prompt_len, int) and prompt_len >= 0 else None,
            engine=self.engine, stream=kind != "FINAL_ONLY", **kwargs)

    def output_made(self, state, output, finish_reason):
        """``RequestState.make_request_output`` returned ``output`` (a RequestOutput, or None): send its new
        tokens, and the end."""
        rec = self._open.get(state.request_id)
        if rec is None:
            return
        completion = _completion_of(output, rec.index)
        if completion is not None:
            n = len(completion.token_ids or ())
            new = n if rec.delta else n - rec.seen
        elif finish_reason is not None:
            # No output for this request at its end: with n > 1 and FINAL_ONLY vLLM holds a finished child's
            # output until its siblings finish. Its detokenizer has every token it made.
            new = _generated(state) - rec.seen
        else:
            new = 0
        now = time.time_ns()
        if new > 0:
            rec.seen += new
            # A count over the wire's cap (a huge whole response) is sent capped: the end's completion_tokens
            # carries the total.
            self.client.token(rec.session_id, now, min(new, 65536))
        if finish_reason is None:
            return
        reason = _finish_name(finish_reason)
        if reason in _CHUNK_FINISHES and getattr(state, "streaming_input", False) is True:
            rec.chunk_finish = reason  # one input chunk done; the request waits for the next
            return
        self._end(rec, getattr(state, "stats", None), reason, now)

    def requests_aborted(self, aborted):
        """``OutputProcessor.abort_requests`` returned the internal ids it aborted: end those whose end did not go
        out with an abort output (the offline LLMEngine makes none: its requests have no output queue)."""
        if not isinstance(aborted, (list, tuple)):
            return
        for rid in aborted:
            rec = self._open.get(rid)
            if rec is not None:
                self._end(rec, None, "abort")

    # -- helpers -----------------------------------------------------------

    def _end(self, rec, stats, reason, now=None):
        if rec.ended:
            return
        rec.ended = True
        self._open.pop(rec.request_id, None)
        if self._by_session.get(rec.session_id) is rec:
            del self._by_session[rec.session_id]
        kwargs = _timing(stats)
        if reason == "error":
            kwargs["error"] = ENGINE_ERROR_TYPE
        self.client.end(rec.session_id, now or time.time_ns(), completion_tokens=rec.seen, finish_reason=reason,
                        **kwargs)

    def _state_gone(self, rec):
        # A weakref finalizer: runs when vLLM drops a RequestState, wherever that happens; nothing may escape it.
        try:
            if not rec.ended:
                self._end(rec, None, rec.chunk_finish or "abort")
        except Exception as e:
            try:
                self.failed("end of a dropped request", e)
            except Exception:
                pass

    def _session_id(self, state):
        """The id the client sees (the response's ``id``: vLLM's external request id, which carries the
        ``X-Request-Id`` a gateway set), ``#<index>`` after it for each choice of an n > 1 request. vLLM's internal
        id when that one is too long or is already the id of another request in flight."""
        internal = state.request_id
        external = getattr(state, "external_req_id", None)
        sid = external if isinstance(external, str) and external else internal
        if getattr(state, "parent_req", None) is not None:
            sid = "%s#%d" % (sid, getattr(state, "request_index", 0))
        if len(sid.encode()) > _MAX_SESSION_ID_BYTES or sid in self._by_session:
            sid = internal
            if len(sid.encode()) > _MAX_SESSION_ID_BYTES or sid in self._by_session:
                sid = "vllm-" + hashlib.sha256(sid.encode()).hexdigest()
        return sid


def _kind_name(kind):
    name = getattr(kind, "name", None)
    return name if isinstance(name, str) else str(kind)


def _finish_name(finish_reason):
    # vLLM's FinishReason prints as its lower-case name; a member of an enum that does not is named by its name.
    if isinstance(finish_reason, enum.Enum):
        return finish_reason.name.lower()
    return str(finish_reason).lower()


def _generated(state):
    detok = getattr(state, "detokenizer", None)
    ids = getattr(detok, "output_token_ids", None)
    return len(ids) if ids is not None else 0


def _completion_of(output, index):
    """The CompletionOutput of choice ``index`` in a RequestOutput (parallel sampling puts siblings beside it)."""
    if output is None:
        return None
    outputs = getattr(output, "outputs", None)
    if not isinstance(outputs, (list, tuple)) or not outputs:
        return None
    for o in outputs:
        if getattr(o, "index", 0) == index:
            return o
    return None


def _trace_headers(headers):
    """The W3C trace context of a request's trace_headers: ((trace_id, parent_span_id) or None, tracestate)."""
    if not headers or not hasattr(headers, "items"):
        return None, None
    lower = {str(k).lower(): v for k, v in headers.items()}
    tp, ts = lower.get("traceparent"), lower.get("tracestate")
    parsed = None
    if isinstance(tp, str):
        parts = tp.strip().split("-")
        if len(parts) == 4 and len(parts[1]) == 32 and len(parts[2]) == 16:
            try:
                if int(parts[1], 16) and int(parts[2], 16):
                    parsed = (parts[1].lower(), parts[2].lower())
            except ValueError:
                parsed = None
    if not isinstance(ts, str) or not ts or len(ts) > 512 or not all(" " <= c <= "~" for c in ts):
        ts = None
    return parsed, ts


def _timing(stats):
    """end() keyword arguments for the engine's split, from vLLM's RequestStateStats (monotonic seconds, 0 unset)."""
    if stats is None:
        return {}

    def ts(name):
        v = getattr(stats, name, 0.0)
        return v if isinstance(v, (int, float)) and v > 0 else 0.0

    q, s, f, last = ts("queued_ts"), ts("scheduled_ts"), ts("first_token_ts"), ts("last_token_ts")
    out = {}
    if q > 0 and s >= q:
        out["queue_time_ns"] = int((s - q) * 1e9)
    if s > 0 and f >= s:
        out["prefill_time_ns"] = int((f - s) * 1e9)
    if f > 0 and last >= f:
        out["decode_time_ns"] = int((last - f) * 1e9)
    return out


# -- patching ---------------------------------------------------------------


def _wrap(func, observer, after):
    """A wrapper that calls ``func`` once with exactly what it was given and returns its result; ``after(args,
    kwargs, result)`` runs then, and nothing it does escapes."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        result = func(*args, **kwargs)
        try:
            after(args, kwargs, result)
        except Exception as e:  # the plugin's own failure: never into vLLM
            try:
                observer.failed(func.__name__, e)
            except Exception:
                pass
        return result

    setattr(wrapper, patching.MARK, True)
    return wrapper


def install(output_processor_module, observer):
    """Wrap the ``TARGETS`` of vLLM's ``vllm.v1.engine.output_processor`` module so that they tell ``observer``.

    Returns True when it patched, False when it did not (already patched, or refused). Never raises."""
    try:
        return _install(output_processor_module, observer)
    except Exception as e:
        patching.counters.register_errors += 1
        patching.say_once("install", logging.WARNING,
                          "otelcol-llm vLLM plugin: install failed (%s); vLLM runs unchanged", type(e).__name__)
        return False


def _install(module, observer):
    checked = []
    for t in TARGETS:
        cls = getattr(module, t.cls, None)
        ok, why = patching.check(cls, t)
        if ok is None:
            patching.refuse(t, why)
            if t.essential:
                patching.say_once("off", logging.WARNING,
                                  "otelcol-llm vLLM plugin: off: this vLLM's output processor is not shaped as "
                                  "the plugin knows it; see hooks/python/README.md for the versions checked")
                return False
            continue
        func, where = ok
        if getattr(func, patching.MARK, False):
            return False  # already installed
        checked.append((cls, t, func, where))

    def after_add(where):
        def after(args, kwargs, result):
            observer.request_added(args[0], patching.arg(where, args, kwargs, "request"))
        return after

    def after_output(where):
        def after(args, kwargs, result):
            observer.output_made(args[0], result, patching.arg(where, args, kwargs, "finish_reason"))
        return after

    def after_abort(where):
        def after(args, kwargs, result):
            observer.requests_aborted(result)
        return after

    makers = {"add_request": after_add, "make_request_output": after_output, "abort_requests": after_abort}
    for cls, t, func, where in checked:
        setattr(cls, t.method, _wrap(func, observer, makers[t.method](where)))
    patching.counters.installed = True
    return True


def _engine_share():
    v = os.environ.get(ENV_ENGINE_SHARE)
    if v is None or v == "":
        return ENGINE_SHARE_DEFAULT
    return v.strip() not in ("0", "false", "no", "off")


def _rust_frontend():
    # As vLLM's envs.py reads it: bool(int(value)); a value that is not an integer stops vLLM itself.
    try:
        return bool(int(os.environ.get(ENV_RUST_FRONTEND, "0")))
    except ValueError:
        return False


_observer = None
_ledger = None


def register():
    """The ``vllm.general_plugins`` entry point. vLLM calls it in each of its processes, possibly more than once,
    and without a guard: it never raises."""
    global _observer
    try:
        endpoint = os.environ.get(ENV_ENDPOINT)
        if not endpoint:
            return
        share = _engine_share()
        if share:
            _register_engine_core(endpoint)
        if _rust_frontend():
            patching.counters.rust_frontend = True
            patching.say_once("rust", logging.WARNING,
                              "otelcol-llm vLLM plugin: %s=1: vLLM's Rust frontend serves requests and its Python "
                              "output processor is not in the serving path, so the plugin sees no request; put the "
                              "token_stream proxy in front of vLLM instead", ENV_RUST_FRONTEND)
        try:
            from vllm.v1.engine import output_processor
        except Exception as e:  # not vLLM V1: nothing to attach to
            patching.say_once("import", logging.WARNING,
                              "otelcol-llm vLLM plugin: vLLM V1's output processor not found (%s); plugin off",
                              type(e).__name__)
            return
        if _observer is None:
            from otelcol_llm_hook import Client, node_endpoint

            if endpoint == NODE_ENDPOINT:
                endpoint = node_endpoint()
            engine = _engine_name()
            _observer = Observer(functools.partial(Client, endpoint),
                                 model=os.environ.get("OTELCOL_LLM_HOOK_MODEL") or None,
                                 engine=engine, operation=os.environ.get("OTELCOL_LLM_HOOK_OPERATION") or "chat",
                                 engine_request_ids=share)
        if install(output_processor, _observer):
            patching.say_once("on", logging.INFO, "otelcol-llm vLLM plugin: sending token events to %s", endpoint)
    except Exception as e:
        patching.counters.register_errors += 1
        patching.say_once("register", logging.WARNING,
                          "otelcol-llm vLLM plugin: register failed (%s); vLLM runs unchanged", type(e).__name__)


def _engine_name():
    return os.environ.get("OTELCOL_LLM_HOOK_ENGINE") or "vllm-" + socket.gethostname()


def _register_engine_core(endpoint):
    """In vLLM's engine core (its EngineCore.__init__ is loading the plugins), count each request's share of the
    engine's steps (otelcol_llm_vllm_steps). Elsewhere, nothing."""
    global _ledger
    import otelcol_llm_vllm_steps as steps

    if not steps.in_engine_core():
        return
    try:
        from vllm.v1.core.sched import scheduler
    except Exception as e:
        patching.say_once("import-steps", logging.WARNING,
                          "otelcol-llm vLLM plugin: vLLM V1's scheduler not found (%s); no engine shares",
                          type(e).__name__)
        return
    if _ledger is None:
        from otelcol_llm_hook import Client, node_endpoint

        if endpoint == NODE_ENDPOINT:
            endpoint = node_endpoint()
        _ledger = steps.StepLedger(functools.partial(Client, endpoint), engine=_engine_name())
    if steps.install(scheduler, _ledger):
        patching.say_once("on-steps", logging.INFO, "otelcol-llm vLLM plugin: sending the engine's shares to %s",
                          endpoint)


def stats():
    """The plugin's counts; None while the plugin is off (no endpoint set).

    ``installed``: whether vLLM's output processor is patched; ``refused``: targets not patched because they are
    not shaped as the plugin knows them; ``rust_frontend``: vLLM's Rust frontend is on (the plugin sees nothing);
    ``errors``: failures of the plugin's own work (each costs a session its events, never vLLM anything);
    ``sent``, ``dropped``, ``failed``, ``rejected``: the client's counts of events (0 until the first request)."""
    if not os.environ.get(ENV_ENDPOINT) and _observer is None:
        return None
    s = {"sent": 0, "dropped": 0, "failed": 0, "rejected": 0}
    if _observer is not None and _observer.has_client():
        s.update(_observer.client.stats())
    errors = (_observer.errors if _observer is not None else 0) + patching.counters.register_errors
    if _ledger is not None:
        if _ledger.has_client():
            for k, v in _ledger.client.stats().items():
                s[k] = s.get(k, 0) + v
        s["engine_core"] = _ledger.stats()
        errors += _ledger.errors
    c = patching.counters
    s.update(installed=c.installed, refused=c.refused, rust_frontend=c.rust_frontend,
             steps_installed=c.steps_installed, errors=errors)
    return s
