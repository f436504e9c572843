"""otelcol-llm inside vLLM: token events from vLLM's own server, without editing vLLM.

Installed with the hook (``pip install ./hooks/python``), this module is a vLLM *general plugin*: the package
registers ``register`` in the entry point group ``vllm.general_plugins`` (name ``otelcol_llm``), which vLLM loads in
each of its processes at start (``vllm/plugins/__init__.py``, ``load_general_plugins``). It does nothing unless
``OTELCOL_LLM_HOOK_ENDPOINT`` is set (e.g. ``udp://127.0.0.1:4321``): installing it never changes vLLM's behaviour
on its own.

With the endpoint set, it wraps two methods of vLLM V1's output processor (``vllm/v1/engine/output_processor.py``),
which runs in the API server process and sees every output of every engine step:

- ``OutputProcessor.add_request``: a request enters; the plugin sends its ``start`` (arrival time, prompt length,
  the request's trace context, whether it streams);
- ``RequestState.make_request_output``: every ``RequestOutput`` vLLM makes for a request; the plugin sends a
  ``token`` event with the number of tokens the output adds, and with the last one the ``end``: finish reason,
  completion tokens, and the engine's own split of the request's time from its ``RequestStateStats`` (queued to
  scheduled, scheduled to first token, first to last token).

Token counts come from token ids, never text, and are right for every ``RequestOutputKind``: a ``DELTA`` output
(what vLLM's OpenAI server streams) carries only the new tokens; a ``CUMULATIVE`` one carries them all, so the
plugin counts the growth; ``FINAL_ONLY`` (a request that does not stream) makes one output at the end, sent as one
token event of a session marked ``stream: false``. ``stream_interval`` > 1 (several tokens an output) counts as
many tokens.

Written against vLLM at commit d07822605346f767b672503c9aae85aa23ef2d82 (the V1 output processor with
``external_req_id`` and ``stream_interval``). The wrappers never raise into vLLM: anything unexpected (an older or
newer vLLM whose objects differ) is caught, counted in ``stats()["errors"]`` and logged once, and vLLM goes on.
Sending never blocks: the hook's client queues and drops (counted) when full.

Settings (environment):

- ``OTELCOL_LLM_HOOK_ENDPOINT``: the collector's hook endpoint (``udp://host:port`` or ``http(s)://host:port``);
  unset, the plugin is off;
- ``OTELCOL_LLM_HOOK_MODEL``: the model name to report (vLLM's output processor does not know the served name);
- ``OTELCOL_LLM_HOOK_ENGINE``: the engine instance's name (default ``vllm-<hostname>``);
- ``OTELCOL_LLM_HOOK_OPERATION``: ``chat`` (default) or ``text_completion``.
"""

import logging
import os
import socket
import threading
import time

__all__ = ["register", "install", "stats", "Observer"]

_log = logging.getLogger("otelcol_llm_hook.vllm")

ENV_ENDPOINT = "OTELCOL_LLM_HOOK_ENDPOINT"

# Attributes the plugin keeps on vLLM's RequestState objects (plain Python
# objects): the tokens counted so far, and whether its end was sent.
_SEEN = "_otelcol_llm_seen"
_ENDED = "_otelcol_llm_ended"
_MARK = "_otelcol_llm_wrapped"


class Observer:
    """Turns what vLLM's output processor does into hook events for one Client.

    Its methods take vLLM's own objects; they are called by the wrappers ``install`` puts on vLLM's classes, and
    can be called directly (tests, other engines shaped like vLLM).
    """

    def __init__(self, client, *, model=None, engine=None, operation="chat"):
        # client is a Client, or a function that makes one: then the client (and its sender thread) comes into
        # being with the first request, in the one vLLM process that has requests, not in every process that
        # loads the plugin.
        self._client = client
        self.model = model
        self.engine = engine
        self.operation = operation
        self.errors = 0
        self._lock = threading.Lock()
        self._warned = False

    @property
    def client(self):
        c = self._client
        if callable(c) and not hasattr(c, "start"):
            with self._lock:
                if callable(self._client) and not hasattr(self._client, "start"):
                    self._client = self._client()
                c = self._client
        return c

    def _failed(self, where, exc):
        with self._lock:
            self.errors += 1
            warn = not self._warned
            self._warned = True
        if warn:
            _log.warning("otelcol-llm vLLM plugin: %s failed (%s); vLLM goes on, the session may be incomplete",
                         where, type(exc).__name__)

    def request_added(self, request, state):
        """A request entered the output processor: send its start."""
        try:
            if state is None or getattr(state, _SEEN, None) is not None:
                return  # unknown, or a streaming-input update of a request already started
            setattr(state, _SEEN, 0)
            arrival = getattr(request, "arrival_time", None)
            t = int(arrival * 1e9) if arrival else None
            kwargs = {}
            traceparent, tracestate = _trace_headers(getattr(request, "trace_headers", None))
            if traceparent:
                trace_id, parent = traceparent
                kwargs.update(trace_id=trace_id, parent_span_id=parent)
            if tracestate:
                kwargs["tracestate"] = tracestate
            self.client.start(
                state.request_id, t, model=self.model, operation=self.operation,
                prompt_tokens=getattr(state, "prompt_len", None), engine=self.engine,
                stream=_kind_name(getattr(state, "output_kind", None)) != "FINAL_ONLY", **kwargs)
        except Exception as e:  # never into vLLM
            self._failed("start", e)

    def output_made(self, state, output, finish_reason):
        """vLLM made ``output`` (a RequestOutput, or None) for ``state``: send its new tokens, and the end."""
        try:
            seen = getattr(state, _SEEN, None)
            if seen is None or getattr(state, _ENDED, False):
                return
            now = time.time_ns()
            completion = _completion_of(state, output)
            if completion is not None:
                n = len(completion.token_ids or ())
                new = n if _kind_name(state.output_kind) == "DELTA" else n - seen
                if new > 0:
                    seen += new
                    setattr(state, _SEEN, seen)
                    # A count over the wire's cap (a huge whole response) is sent capped: the end's
                    # completion_tokens carries the total.
                    self.client.token(state.request_id, now, min(new, 65536))
            if finish_reason is None:
                return
            setattr(state, _ENDED, True)
            reason = str(finish_reason).lower()
            kwargs = _timing(getattr(state, "stats", None))
            self.client.end(state.request_id, now, completion_tokens=seen, finish_reason=reason, **kwargs)
        except Exception as e:  # never into vLLM
            self._failed("token/end", e)


def _kind_name(kind):
    return getattr(kind, "name", str(kind))


def _completion_of(state, output):
    """The CompletionOutput of this request in a RequestOutput (parallel sampling puts siblings beside it)."""
    if output is None:
        return None
    outputs = getattr(output, "outputs", None)
    if not outputs:
        return None
    index = getattr(state, "request_index", 0)
    for o in outputs:
        if getattr(o, "index", 0) == index:
            return o
    return None


def _trace_headers(headers):
    """The W3C trace context of a request's trace_headers: ((trace_id, parent_span_id) or None, tracestate)."""
    if not headers:
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
    q = getattr(stats, "queued_ts", 0.0) or 0.0
    s = getattr(stats, "scheduled_ts", 0.0) or 0.0
    f = getattr(stats, "first_token_ts", 0.0) or 0.0
    last = getattr(stats, "last_token_ts", 0.0) or 0.0
    out = {}
    if q > 0 and s >= q:
        out["queue_time_ns"] = int((s - q) * 1e9)
    if s > 0 and f >= s:
        out["prefill_time_ns"] = int((f - s) * 1e9)
    if f > 0 and last >= f:
        out["decode_time_ns"] = int((last - f) * 1e9)
    return out


def install(output_processor_module, observer):
    """Wrap ``OutputProcessor.add_request`` and ``RequestState.make_request_output`` of vLLM's
    ``vllm.v1.engine.output_processor`` module so that they tell ``observer``; idempotent."""
    op_cls = output_processor_module.OutputProcessor
    rs_cls = output_processor_module.RequestState
    if getattr(op_cls.add_request, _MARK, False):
        return False
    add_request = op_cls.add_request
    make_request_output = rs_cls.make_request_output

    def wrapped_add_request(self, request, *args, **kwargs):
        result = add_request(self, request, *args, **kwargs)
        observer.request_added(request, self.request_states.get(getattr(request, "request_id", None)))
        return result

    def wrapped_make_request_output(self, new_token_ids, pooling_output, finish_reason, *args, **kwargs):
        output = make_request_output(self, new_token_ids, pooling_output, finish_reason, *args, **kwargs)
        observer.output_made(self, output, finish_reason)
        return output

    for w, orig in ((wrapped_add_request, add_request), (wrapped_make_request_output, make_request_output)):
        w.__name__, w.__doc__, w.__wrapped__ = orig.__name__, orig.__doc__, orig
        setattr(w, _MARK, True)
    op_cls.add_request = wrapped_add_request
    rs_cls.make_request_output = wrapped_make_request_output
    return True


_observer = None


def register():
    """The ``vllm.general_plugins`` entry point. vLLM calls it in each of its processes, possibly more than once."""
    global _observer
    endpoint = os.environ.get(ENV_ENDPOINT)
    if not endpoint:
        return
    try:
        from vllm.v1.engine import output_processor
    except Exception as e:  # not vLLM V1: nothing to attach to
        _log.warning("otelcol-llm vLLM plugin: vLLM V1's output processor not found (%s); plugin off", type(e).__name__)
        return
    if _observer is None:
        from otelcol_llm_hook import Client

        engine = os.environ.get("OTELCOL_LLM_HOOK_ENGINE") or "vllm-" + socket.gethostname()
        _observer = Observer(lambda: Client(endpoint), model=os.environ.get("OTELCOL_LLM_HOOK_MODEL") or None,
                             engine=engine, operation=os.environ.get("OTELCOL_LLM_HOOK_OPERATION") or "chat")
    if install(output_processor, _observer):
        _log.info("otelcol-llm vLLM plugin: sending token events to %s", endpoint)


def stats():
    """The plugin's client counts plus the wrappers' errors; None while the plugin is off."""
    if _observer is None or callable(_observer._client) and not hasattr(_observer._client, "start"):
        return None
    s = dict(_observer.client.stats())
    s["errors"] = _observer.errors
    return s
