"""Tests of otelcol_llm_vllm, the vLLM plugin: run with `python3 -m unittest -v` in this folder.

vLLM cannot be installed here, so the tests drive the plugin through the stand-ins of vllm_standin.py, shaped as
vLLM's output processor, plugin loader and the objects they pass at the vLLM main commit named there. Three parts:

- PluginTest: what reaches the collector for each way vLLM runs a request (DELTA, CUMULATIVE, FINAL_ONLY,
  stream_interval, n > 1, aborts with and without an output queue, streaming input, errors), and the session ids;
- TotalityTest: vLLM's internals changed under the plugin (each patched method with renamed, added and removed
  parameters, attributes renamed, targets missing, the plugin's own code failing): vLLM's calls return what the
  originals return, each original runs exactly once, nothing escapes, and the failure is counted. The plugin is
  loaded as vLLM loads it: an entry point of the group ``vllm.general_plugins``, called by
  ``load_general_plugins`` without a ``try``;
- InstallTest: ``pip install`` of the package, offline, registers the entry point.
"""

import importlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
from unittest import mock

import check_vllm
import otelcol_llm_vllm as plugin
import otelcol_llm_vllm_patching as patching
import test_otelcol_llm_hook
import vllm_standin as vllm
from otelcol_llm_hook import _END, _START, _TOKEN, Client
from vllm_standin import FinishReason, RequestOutputKind, add, request, step

DELTA, CUMULATIVE, FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE, RequestOutputKind.FINAL_ONLY
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Recorder(Client):
    """A real Client (its argument checks run) that records the events instead of sending them."""

    def __init__(self):
        super().__init__("udp://127.0.0.1:9")
        self.events = []

    def _put(self, item):
        if item[0] == _TOKEN:
            _, sid, t, count, _seq = item
            self.events.append({"event": "token", "session_id": sid, "time_unix_nano": t, "count": count})
        else:
            self.events.append(dict(item[1]))

    def sessions(self):
        """The events by session id, in order."""
        out = {}
        for e in self.events:
            out.setdefault(e["session_id"], []).append(e)
        return out


def tokens_of(evs):
    return sum(e["count"] for e in evs if e["event"] == "token")


def reset_plugin():
    plugin._observer = None
    patching.counters = patching.Counters()
    patching.said.clear()


class PluginTest(unittest.TestCase):
    def setUp(self):
        self.client = Recorder()
        self.observer = plugin.Observer(self.client, model="llama", engine="vllm-0")
        self.mod = vllm.output_processor_module()
        self.assertTrue(plugin.install(self.mod, self.observer))
        self.assertFalse(plugin.install(self.mod, self.observer), "idempotent")
        self.proc = self.mod.OutputProcessor(None, log_stats=True)

    def tearDown(self):
        self.client.close()

    def run_request(self, kind, steps, *, finish=FinishReason.LENGTH, stream_interval=None, **kw):
        """One request through the output processor: steps are lists of new token ids; the last ends it."""
        req = request("r1", kind, stream_interval=stream_interval, **kw)
        (rid,) = add(self.proc, req)
        st = self.proc.request_states[rid].stats
        st.queued_ts = time.monotonic()
        time.sleep(0.002)
        st.scheduled_ts = time.monotonic()
        for i, new in enumerate(steps):
            step(self.proc, [(rid, new, finish if i == len(steps) - 1 else None)])
        return req

    def assert_session(self, evs, tokens, *, stream=True, finish="length"):
        self.assertEqual(evs[0]["event"], "start")
        self.assertEqual(evs[0]["prompt_tokens"], 12)
        self.assertEqual(evs[0]["model"], "llama")
        self.assertEqual(evs[0].get("stream", True), stream)
        self.assertEqual(tokens_of(evs), tokens)
        end = evs[-1]
        self.assertEqual(end["event"], "end")
        self.assertEqual(end["completion_tokens"], tokens)
        self.assertEqual(end["finish_reason"], finish)
        self.assertEqual(sum(e["event"] == "end" for e in evs), 1, "one end")

    def only_session(self):
        sessions = self.client.sessions()
        self.assertEqual(len(sessions), 1, sessions)
        return next(iter(sessions.values()))

    def test_delta(self):
        # What vLLM's OpenAI server streams: each output carries only its new tokens.
        self.run_request(DELTA, [[1], [2, 3], [4], [5]])
        evs = self.only_session()
        self.assert_session(evs, 5)
        self.assertEqual([e["count"] for e in evs if e["event"] == "token"], [1, 2, 1, 1])
        end = evs[-1]
        for k in ("queue_time_ns", "prefill_time_ns", "decode_time_ns"):
            self.assertGreaterEqual(end[k], 0, k)
        self.assertGreaterEqual(end["queue_time_ns"], 2_000_000, "the 2 ms between queued and scheduled")
        self.assertEqual(self.observer.in_flight(), 0, "nothing kept after the end")

    def test_cumulative(self):
        # AsyncLLM.generate's default: each output carries every token so far; the growth is counted.
        self.run_request(CUMULATIVE, [[1], [2, 3], [4], [5]])
        evs = self.only_session()
        self.assert_session(evs, 5)
        self.assertEqual([e["count"] for e in evs if e["event"] == "token"], [1, 2, 1, 1])

    def test_final_only(self):
        # A request that does not stream: one output at the end, the session marked stream: false.
        self.run_request(FINAL_ONLY, [[1], [2, 3], [4], [5]])
        self.assert_session(self.only_session(), 5, stream=False)

    def test_stream_interval(self):
        # --stream-interval 3: outputs carry several tokens (DELTA from the offset).
        self.run_request(DELTA, [[1], [2], [3], [4], [5], [6], [7]], stream_interval=3)
        evs = self.only_session()
        self.assert_session(evs, 7)
        self.assertEqual([e["count"] for e in evs if e["event"] == "token"], [1, 3, 3])

    def test_session_id_is_the_id_the_client_sees(self):
        # vLLM's OpenAI server makes the external id "chatcmpl-<X-Request-Id>" (the response's id); the internal
        # one adds 8 hex digits. The session is the external one, so it joins the proxy's and the gateway's view.
        req = self.run_request(DELTA, [[1], [2]], external="chatcmpl-gw-7f3a")
        self.assertNotEqual(req.request_id, "chatcmpl-gw-7f3a")
        self.assertEqual(list(self.client.sessions()), ["chatcmpl-gw-7f3a"])

    def test_conversation_id(self):
        # vLLM's session_id (request body or X-Session-ID) names the conversation: a start attribute.
        self.run_request(DELTA, [[1]], session_id="conv-42")
        self.assertEqual(self.only_session()[0]["attributes"], {"gen_ai.conversation.id": "conv-42"})

    def test_n2_streams_each_choice(self):
        req = request("p", DELTA, n=2)
        a, b = add(self.proc, req)
        step(self.proc, [(a, [1], None), (b, [7], None)])
        step(self.proc, [(a, [2], FinishReason.STOP), (b, [8], None)])
        step(self.proc, [(b, [9], FinishReason.LENGTH)])
        s = self.client.sessions()
        self.assertEqual(sorted(s), ["chatcmpl-p#0", "chatcmpl-p#1"])
        self.assert_session(s["chatcmpl-p#0"], 2, finish="stop")
        self.assert_session(s["chatcmpl-p#1"], 3)

    def test_n2_final_only_counts_the_child_that_finishes_first(self):
        # vLLM holds the first finished child's output until its sibling finishes: it makes no output for it.
        req = request("q", FINAL_ONLY, n=2)
        a, b = add(self.proc, req)
        step(self.proc, [(a, [1], None), (b, [7], None)])
        step(self.proc, [(a, [2], FinishReason.STOP), (b, [8], None)])
        step(self.proc, [(b, [9], FinishReason.LENGTH)])
        s = self.client.sessions()
        self.assert_session(s["chatcmpl-q#0"], 2, stream=False, finish="stop")
        self.assert_session(s["chatcmpl-q#1"], 3, stream=False)

    def test_abort_with_output_and_trace_context(self):
        headers = {"traceparent": TRACEPARENT, "tracestate": "ot=th:8"}
        (rid,) = add(self.proc, request("r2", DELTA, headers=headers))
        step(self.proc, [(rid, [9], None)])
        self.proc.abort_requests([rid], internal=True)
        evs = self.only_session()
        self.assertEqual(evs[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736")
        self.assertEqual(evs[0]["parent_span_id"], "00f067aa0ba902b7")
        self.assertEqual(evs[0]["tracestate"], "ot=th:8")
        self.assert_session(evs, 1, finish="abort")

    def test_abort_by_external_id_of_n2(self):
        a, b = add(self.proc, request("r4", DELTA, n=2))
        step(self.proc, [(a, [1], None), (b, [1], None)])
        self.proc.abort_requests(["chatcmpl-r4"], internal=False)
        s = self.client.sessions()
        self.assertEqual(sorted(s), ["chatcmpl-r4#0", "chatcmpl-r4#1"])
        for evs in s.values():
            self.assert_session(evs, 1, finish="abort")

    def test_offline_engine_abort(self):
        # LLMEngine's requests have no output queue: vLLM makes no abort output for them.
        (rid,) = add(self.proc, request("r5", DELTA), queue=False)
        out = step(self.proc, [(rid, [1, 2], None)])
        self.assertEqual(len(out.request_outputs), 1, "the offline engine returns its outputs")
        self.assertEqual(self.proc.abort_requests([rid], internal=True), [rid])
        self.assert_session(self.only_session(), 2, finish="abort")
        self.assertEqual(self.observer.in_flight(), 0)

    def test_streaming_input(self):
        # A resumable request takes its input in chunks; each chunk's generation "finishes" inside vLLM, but the
        # session is the whole request: it ends when the last chunk is in and generated.
        first = request("s1", DELTA, resumable=True)
        (rid,) = add(self.proc, first)
        step(self.proc, [(rid, [1], None)])
        step(self.proc, [(rid, [2], FinishReason.STOP)])
        second = request("s1", DELTA, resumable=True)  # the same request id: the next chunk
        self.proc.add_request(second, None)
        step(self.proc, [(rid, [3], None)])
        step(self.proc, [(rid, [4], None)])
        step(self.proc, [(rid, [5], FinishReason.STOP)])
        self.assertNotIn("end", [e["event"] for e in self.client.events], "not ended between chunks")
        final = request("s1", DELTA, resumable=False)  # the end of the input, after generation finished
        self.proc.add_request(final, None)
        self.assertNotIn(rid, self.proc.request_states, "vLLM ended the request inside add_request")
        self.assert_session(self.only_session(), 5, finish="stop")
        self.assertEqual(self.observer.in_flight(), 0)

    def test_streaming_input_ended_while_generating(self):
        (rid,) = add(self.proc, request("s2", DELTA, resumable=True))
        step(self.proc, [(rid, [1], None)])
        self.proc.add_request(request("s2", DELTA, resumable=False), None)  # input ends mid-generation
        step(self.proc, [(rid, [2], None)])
        step(self.proc, [(rid, [3], FinishReason.LENGTH)])
        self.assert_session(self.only_session(), 3)

    def test_error_finish_carries_an_error_type(self):
        self.run_request(DELTA, [[1], [2]], finish=FinishReason.ERROR)
        end = self.only_session()[-1]
        self.assertEqual(end["finish_reason"], "error")
        self.assertEqual(end["error"], "InternalServerError", "what vLLM streams to the client for it")

    def test_repetition_finish(self):
        self.run_request(DELTA, [[1], [2]], finish=FinishReason.REPETITION)
        self.assertEqual(self.only_session()[-1]["finish_reason"], "repetition")
        self.assertNotIn("error", self.only_session()[-1])

    def test_same_external_id_twice_in_flight(self):
        # Two requests with one X-Request-Id: the second is its own session, under vLLM's internal id.
        r1, r2 = request("d1", DELTA, external="dup"), request("d2", DELTA, external="dup")
        (a,) = add(self.proc, r1)
        (b,) = add(self.proc, r2)
        step(self.proc, [(a, [1], None), (b, [1], None)])
        step(self.proc, [(a, [2], FinishReason.STOP), (b, [2], FinishReason.STOP)])
        s = self.client.sessions()
        self.assertEqual(sorted(s), sorted(["dup", b]))
        for evs in s.values():
            self.assert_session(evs, 2, finish="stop")

    def test_over_long_external_id(self):
        long = "x" * 300
        self.run_request(DELTA, [[1]], external=long)
        (sid,) = self.client.sessions()
        self.assertLessEqual(len(sid.encode()), 256)
        self.assert_session(self.client.sessions()[sid], 1)
        self.assertEqual(self.observer.errors, 0)

    def test_pooling_request_is_no_session(self):
        req = request("e1", DELTA)
        req.sampling_params = None
        req.pooling_params = mock.Mock(output_kind=FINAL_ONLY)
        self.proc.add_request(req, None)
        self.proc.process_outputs([vllm.EngineCoreOutput(request_id=req.request_id, new_token_ids=[],
                                                         pooling_output=[0.5], finish_reason=FinishReason.STOP)])
        self.assertEqual(self.client.events, [])

    def test_many_requests_leave_nothing_behind(self):
        for i in range(200):
            (rid,) = add(self.proc, request("m%d" % i, DELTA), queue=i % 2 == 0)
            step(self.proc, [(rid, [1], None)])
            if i % 3 == 0:
                self.proc.abort_requests([rid], internal=True)
            else:
                step(self.proc, [(rid, [2], FinishReason.STOP)])
        self.assertEqual(len(self.client.sessions()), 200)
        self.assertEqual(sum(e["event"] == "end" for e in self.client.events), 200)
        self.assertEqual(self.observer.in_flight(), 0)


class Counting:
    """Counts calls of the stand-in methods a variant puts in place, and keeps what each returned."""

    def __init__(self):
        self.calls = {}
        self.returned = {}

    def hit(self, name, result):
        self.calls[name] = self.calls.get(name, 0) + 1
        self.returned.setdefault(name, []).append(result)
        return result


def drive(mod, *, add_kw=False):
    """What vLLM does with its output processor in one run: two AsyncLLM requests (one of n=2), one LLMEngine
    request, tokens, a finish, an abort with an output and one without. Returns what vLLM's calls returned,
    reduced to what a client sees."""
    proc = mod.OutputProcessor(None, log_stats=True)
    seen = []

    def outputs(res):
        return [(o.request_id, [(c.index, list(c.token_ids), c.finish_reason) for c in o.outputs], o.finished)
                for o in res.request_outputs]

    ids = []
    for req, queue in ((request("t1", DELTA), True), (request("t2", CUMULATIVE, n=2), True),
                       (request("t3", DELTA), False)):
        if add_kw:
            q = vllm.RequestOutputCollector(DELTA, req.request_id) if queue else None
            seen.append(proc.add_request(request=req, prompt=None, queue=q))
            ids.append(req.request_id)
        else:
            ids.extend(add(proc, req, queue=queue))
    seen.append(outputs(step(proc, [(r, [1, 2], None) for r in ids])))
    seen.append(outputs(step(proc, [(ids[0], [3], FinishReason.STOP)])))
    abort = getattr(proc, "abort_requests", None) or proc.abort
    seen.append(abort(ids[1:2], internal=True))
    seen.append(abort([ids[-1]], internal=True))
    seen.append(sorted(proc.request_states))
    queues = [st.queue.items for st in proc.request_states.values() if st.queue is not None]
    seen.append(len(queues))
    return seen


# Variants of vLLM's output processor: what vLLM might become. Each takes a fresh stand-in module and a Counting,
# and changes the module in place; ``counted`` names the methods whose calls must be seen exactly once each.


def v_add_request_new_param(mod, c):
    orig = mod.OutputProcessor.add_request

    def add_request(self, request, prompt, parent_req=None, request_index=0, queue=None, *, priority=0):
        return c.hit("add_request", orig(self, request, prompt, parent_req, request_index, queue))

    mod.OutputProcessor.add_request = add_request


def v_add_request_renamed_param(mod, c):
    orig = mod.OutputProcessor.add_request

    def add_request(self, engine_request, prompt, parent_req=None, request_index=0, queue=None):
        return c.hit("add_request", orig(self, engine_request, prompt, parent_req, request_index, queue))

    mod.OutputProcessor.add_request = add_request


def v_add_request_keyword_only(mod, c):
    orig = mod.OutputProcessor.add_request

    def add_request(self, *, request, prompt, parent_req=None, request_index=0, queue=None):
        return c.hit("add_request", orig(self, request, prompt, parent_req, request_index, queue))

    mod.OutputProcessor.add_request = add_request


def v_make_request_output_more_params(mod, c):
    orig = mod.RequestState.make_request_output

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                            kv_transfer_params=None, ec_transfer_params=None, routed_experts=None):
        return c.hit("make_request_output", orig(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                                                 kv_transfer_params, ec_transfer_params))

    mod.RequestState.make_request_output = make_request_output


def v_make_request_output_fewer_params(mod, c):
    orig = mod.RequestState.make_request_output

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason, *rest, **kwargs):
        return c.hit("make_request_output", orig(self, new_token_ids, pooling_output, finish_reason, stop_reason))

    mod.RequestState.make_request_output = make_request_output


def v_make_request_output_renamed_finish(mod, c):
    orig = mod.RequestState.make_request_output

    def make_request_output(self, new_token_ids, pooling_output, reason=None, stop_reason=None,
                            kv_transfer_params=None, ec_transfer_params=None, **kw):
        reason = kw.pop("finish_reason", reason)  # vLLM's own callers, as they would be after the rename
        return c.hit("make_request_output",
                     orig(self, new_token_ids, pooling_output, reason, stop_reason, kv_transfer_params,
                          ec_transfer_params))

    mod.RequestState.make_request_output = make_request_output


def v_make_request_output_static(mod, c):
    orig = mod.RequestState.make_request_output

    def make_request_output(state, new_token_ids, pooling_output, finish_reason, stop_reason,
                            kv_transfer_params=None, ec_transfer_params=None):
        return c.hit("make_request_output", orig(state, new_token_ids, pooling_output, finish_reason, stop_reason,
                                                 kv_transfer_params, ec_transfer_params))

    # A staticmethod: vLLM would call it as RequestState.make_request_output(state, …).
    mod.RequestState.make_request_output = staticmethod(make_request_output)
    call_site = mod.OutputProcessor.process_outputs

    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None):
        for st in self.request_states.values():
            st.make_request_output = (lambda st: lambda *a, **k: make_request_output(st, *a, **k))(st)
        return call_site(self, engine_core_outputs, engine_core_timestamp, iteration_stats)

    mod.OutputProcessor.process_outputs = process_outputs


def v_abort_requests_renamed(mod, c):
    orig = mod.OutputProcessor.abort_requests

    def abort_requests(self, ids, internal, *, reason=None):
        return c.hit("abort_requests", orig(self, ids, internal))

    mod.OutputProcessor.abort_requests = abort_requests


def v_abort_requests_gone(mod, c):
    orig = mod.OutputProcessor.abort_requests
    del mod.OutputProcessor.abort_requests
    mod.OutputProcessor.abort = orig


def v_add_request_gone(mod, c):
    mod.OutputProcessor.register_request = mod.OutputProcessor.add_request
    del mod.OutputProcessor.add_request
    mod.OutputProcessor.add_request = property(lambda self: self.register_request)


def v_request_state_gone(mod, c):
    del mod.RequestState


def hidden_from_plugin(cls, attr):
    """vLLM renamed ``attr``: the plugin no longer finds it (vLLM's own code, rewritten with it, still does)."""
    key = "_renamed_" + attr

    def get(self):
        if sys._getframe(1).f_globals.get("__name__") == plugin.__name__:
            raise AttributeError("%r object has no attribute %r" % (type(self).__name__, attr))
        return self.__dict__[key]

    def put(self, value):
        self.__dict__[key] = value

    def delete(self):
        del self.__dict__[key]

    setattr(cls, attr, property(get, put, delete))


def v_request_states_renamed(mod, c):
    hidden_from_plugin(mod.OutputProcessor, "request_states")
    orig = mod.OutputProcessor.add_request

    def add_request(self, request, prompt, parent_req=None, request_index=0, queue=None):
        return c.hit("add_request", orig(self, request, prompt, parent_req, request_index, queue))

    mod.OutputProcessor.add_request = add_request


def v_state_attributes_renamed(mod, c):
    for attr in ("output_kind", "request_id", "detokenizer"):
        hidden_from_plugin(mod.RequestState, attr)
    orig = mod.RequestState.make_request_output

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                            kv_transfer_params=None, ec_transfer_params=None):
        return c.hit("make_request_output", orig(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                                                 kv_transfer_params, ec_transfer_params))

    mod.RequestState.make_request_output = make_request_output


def v_state_slots(mod, c):
    # A RequestState that cannot be weakly referenced (__slots__ without __weakref__).
    base = mod.RequestState
    names = ("request_id external_req_id parent_req request_index lora_request lora_name output_kind prompt "
             "prompt_token_ids prompt_embeds prompt_len logprobs_processor detokenizer max_tokens_param top_p n "
             "temperature is_prefilling queue num_cached_tokens num_cache_creation_tokens stats stream_interval sent_tokens_offset "
             "streaming_input input_chunk_queue").split()
    ns = {k: v for k, v in vars(base).items() if k not in ("__dict__", "__weakref__")}
    ns["__slots__"] = tuple(names)
    mod.RequestState = type("RequestState", (), ns)
    # from_new_request's cls is the new class; OutputProcessor refers to RequestState by the closure name, so
    # point its add_request at the new class.
    orig_add = mod.OutputProcessor.add_request
    slotted = mod.RequestState

    def add_request(self, request, prompt, parent_req=None, request_index=0, queue=None):
        if request.request_id in self.request_states:
            return c.hit("add_request", orig_add(self, request, prompt, parent_req, request_index, queue))
        st = slotted.from_new_request(None, request, prompt, parent_req, request_index, queue, self.log_stats,
                                      self.stream_interval)
        self.request_states[request.request_id] = st
        if parent_req:
            self.parent_requests[parent_req.request_id] = parent_req
        self.external_req_ids[st.external_req_id].append(request.request_id)
        return c.hit("add_request", None)

    mod.OutputProcessor.add_request = add_request


VARIANTS = {
    # name: (variant, the plugin patches, counted failure, methods called once per vLLM call)
    "add_request with a new parameter": (v_add_request_new_param, True, None, ["add_request"]),
    "add_request with request renamed": (v_add_request_renamed_param, False, "refused", ["add_request"]),
    "add_request keyword-only": (v_add_request_keyword_only, True, None, ["add_request"]),
    "make_request_output with more parameters": (v_make_request_output_more_params, True, None,
                                                 ["make_request_output"]),
    "make_request_output with fewer parameters": (v_make_request_output_fewer_params, True, None,
                                                  ["make_request_output"]),
    "make_request_output with finish_reason renamed": (v_make_request_output_renamed_finish, False, "refused",
                                                       ["make_request_output"]),
    "make_request_output a staticmethod": (v_make_request_output_static, False, "refused", ["make_request_output"]),
    "abort_requests with parameters renamed": (v_abort_requests_renamed, True, None, ["abort_requests"]),
    "abort_requests gone": (v_abort_requests_gone, True, "refused", []),
    "add_request gone": (v_add_request_gone, False, "refused", []),
    "RequestState gone": (v_request_state_gone, False, "refused", []),
    "request_states unreadable after add_request": (v_request_states_renamed, True, "errors", ["add_request"]),
    "RequestState attributes renamed": (v_state_attributes_renamed, True, "errors", ["make_request_output"]),
    "RequestState with __slots__": (v_state_slots, True, "errors", ["add_request"]),
}


class TotalityTest(unittest.TestCase):
    """vLLM changed under the plugin: loaded through vLLM's plugin loader, it never harms vLLM."""

    def setUp(self):
        reset_plugin()
        # The package's entry point, as pip installs it: a dist-info on sys.path.
        self.tmp = tempfile.mkdtemp()
        info = os.path.join(self.tmp, "otelcol_llm_hook-0.1.0.dist-info")
        os.mkdir(info)
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: otelcol-llm-hook\nVersion: 0.1.0\n")
        with open(os.path.join(info, "entry_points.txt"), "w") as f:
            f.write("[vllm.general_plugins]\notelcol_llm = otelcol_llm_vllm:register\n")
        sys.path.insert(0, self.tmp)
        importlib.invalidate_caches()
        self.client = Recorder()
        patcher = mock.patch.object(plugin, "Observer", side_effect=lambda _c, **kw: plugin_observer(self.client, kw))
        patcher.start()
        self.addCleanup(patcher.stop)
        env = mock.patch.dict(os.environ, {plugin.ENV_ENDPOINT: "udp://127.0.0.1:9"})
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop("VLLM_PLUGINS", None)
        os.environ.pop(plugin.ENV_RUST_FRONTEND, None)

    def tearDown(self):
        sys.path.remove(self.tmp)
        shutil.rmtree(self.tmp)
        self.client.close()
        reset_plugin()

    def load(self, mod):
        """vLLM's start: load_general_plugins with the stand-in vLLM in sys.modules. Raises what vLLM would."""
        with mock.patch.dict(sys.modules, vllm.vllm_modules(mod)):
            vllm.load_general_plugins()

    def test_unchanged_vllm(self):
        mod = vllm.output_processor_module()
        self.load(mod)
        self.assertTrue(plugin.stats()["installed"])
        drive(mod)
        self.assertEqual(len(self.client.sessions()), 4, "t1, t2#0, t2#1, t3")
        self.assertEqual(plugin.stats()["errors"], 0)
        self.assertEqual(plugin.stats()["refused"], 0)

    def test_variants(self):
        for name, (variant, patches, failure, counted) in VARIANTS.items():
            with self.subTest(name):
                reset_plugin()
                self.client.events.clear()
                plain, patched = vllm.output_processor_module(), vllm.output_processor_module()
                c_plain, c_patched = Counting(), Counting()
                variant(plain, c_plain)
                variant(patched, c_patched)
                with self.assertLogs("vllm.plugins.otelcol_llm", "INFO") as logs:
                    self.load(patched)  # must not raise: vLLM calls the plugin without a try
                    if not hasattr(patched, "RequestState"):
                        continue  # vLLM itself could not run; the plugin refused and raised nothing
                    kw = name == "add_request keyword-only"
                    want = drive(plain, add_kw=kw)
                    got = drive(patched, add_kw=kw)  # must not raise
                self.assertEqual(got, want, "vLLM's calls return what the originals return")
                for m in counted:
                    self.assertEqual(c_patched.calls.get(m), c_plain.calls.get(m), "%s called once a call" % m)
                    for a, b in zip(c_patched.returned[m], c_plain.returned[m]):
                        self.assertEqual(type(a), type(b))
                s = plugin.stats()
                self.assertEqual(s["installed"], patches, s)
                if failure is None:
                    self.assertEqual((s["refused"], s["errors"]), (0, 0), s)
                    self.assertEqual(len(self.client.sessions()), 3 if kw else 4)
                else:
                    self.assertGreater(s[failure], 0, s)
                    self.assertTrue(any("WARNING" in line for line in logs.output), logs.output)

    def test_original_exceptions_pass_through_once(self):
        mod = vllm.output_processor_module()
        calls = []

        def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                                kv_transfer_params=None, ec_transfer_params=None):
            calls.append(1)
            raise KeyError("vLLM's own failure")

        mod.RequestState.make_request_output = make_request_output
        self.load(mod)
        proc = mod.OutputProcessor(None, log_stats=False)
        (rid,) = add(proc, request("x", DELTA))
        with self.assertRaises(KeyError) as e:
            step(proc, [(rid, [1], None)])
        self.assertEqual(e.exception.args, ("vLLM's own failure",), "vLLM's exception, as raised")
        self.assertEqual(len(calls), 1)
        self.assertEqual(plugin.stats()["errors"], 0)

    def test_plugin_failing_everywhere(self):
        # The plugin's own code failing on every call (here its client) costs sessions, never vLLM.
        class Broken(Recorder):
            def _put(self, item):
                raise RuntimeError("boom")

        self.client.close()
        self.client = Broken()
        mod, plain = vllm.output_processor_module(), vllm.output_processor_module()
        with self.assertLogs("vllm.plugins.otelcol_llm", "WARNING") as logs:
            self.load(mod)
            self.assertEqual(drive(mod), drive(plain))
        self.assertGreater(plugin.stats()["errors"], 0)
        self.assertEqual(len(logs.output), 1, "logged once")
        self.assertNotIn("boom", logs.output[0], "the exception's class, never its text")

    def test_no_vllm(self):
        # The entry point in a process without vLLM V1 (e.g. another engine's environment).
        with mock.patch.dict(sys.modules, {"vllm": None}), self.assertLogs("vllm.plugins.otelcol_llm", "WARNING"):
            vllm.load_general_plugins()
        self.assertFalse(plugin.stats()["installed"])

    def test_register_never_raises(self):
        with mock.patch.object(plugin, "install", side_effect=RuntimeError("unexpected")), \
                self.assertLogs("vllm.plugins.otelcol_llm", "WARNING"):
            self.load(vllm.output_processor_module())
        self.assertEqual(plugin.stats()["errors"], 1)

    def test_off_without_endpoint(self):
        os.environ.pop(plugin.ENV_ENDPOINT)
        mod = vllm.output_processor_module()
        before = mod.OutputProcessor.add_request
        self.load(mod)
        self.assertIs(mod.OutputProcessor.add_request, before, "installing the package changes nothing by itself")
        self.assertIsNone(plugin.stats())

    def test_loaded_twice(self):
        # vLLM may load general plugins more than once (one process per role, reloads).
        mod = vllm.output_processor_module()
        self.load(mod)
        self.load(mod)
        drive(mod)
        self.assertEqual(sum(e["event"] == "start" for e in self.client.events), 4, "one start each, not two")

    def test_vllm_plugins_filter(self):
        os.environ["VLLM_PLUGINS"] = "something_else"
        mod = vllm.output_processor_module()
        before = mod.OutputProcessor.add_request
        self.load(mod)
        self.assertIs(mod.OutputProcessor.add_request, before)

    def test_rust_frontend_said_once(self):
        os.environ[plugin.ENV_RUST_FRONTEND] = "1"
        with self.assertLogs("vllm.plugins.otelcol_llm", "WARNING") as logs:
            self.load(vllm.output_processor_module())
            plugin.register()
        self.assertTrue(plugin.stats()["rust_frontend"])
        said = [line for line in logs.output if "Rust frontend" in line]
        self.assertEqual(len(said), 1, logs.output)

    def test_no_client_until_first_request(self):
        # The client (and its sender thread) comes into being with the first request, in the one process that
        # has requests, not in every process that loads the plugin.
        made = []

        def client(endpoint):
            made.append(endpoint)
            return self.client

        mod = vllm.output_processor_module()
        with mock.patch.object(plugin, "Observer", _RealObserver), \
                mock.patch("otelcol_llm_hook.Client", side_effect=client):
            self.load(mod)
            self.assertEqual(made, [])
            self.assertEqual(plugin.stats()["sent"], 0)
            drive(mod)
        self.assertEqual(made, ["udp://127.0.0.1:9"])
        self.assertEqual(len(self.client.sessions()), 4)

    def test_node_endpoint(self):
        # "node": the node's collector, its socket where its directory is mounted.
        os.environ[plugin.ENV_ENDPOINT] = "node"
        made = []

        def client(endpoint):
            made.append(endpoint)
            return self.client

        mod = vllm.output_processor_module()
        with mock.patch.object(plugin, "Observer", _RealObserver), \
                mock.patch("otelcol_llm_hook.Client", side_effect=client), \
                mock.patch("otelcol_llm_hook.node_endpoint", return_value="unix:///run/otelcol-llm/hooks.sock"):
            self.load(mod)
            drive(mod)
        self.assertEqual(made, ["unix:///run/otelcol-llm/hooks.sock"])


def plugin_observer(client, kw):
    return _RealObserver(client, **kw)


_RealObserver = plugin.Observer


class PluginCollectorTest(test_otelcol_llm_hook.CollectorTestCase):
    """The plugin, in vLLM's output processor (the stand-in), sending over the Unix socket (what deploy/ wires) to
    the built collector, whose token_session folds the sessions: what a user of vLLM and the collector sees in the
    summaries."""

    processors = {"token_session": {"sampling": {"normal_percent": 100}}}

    def test_sessions_as_vllm_ran_them(self):
        client = Client("unix://" + self.unix_path, flush_interval=0.01)
        self.addCleanup(client.close)
        observer = plugin.Observer(client, model="llama", engine="vllm-0")
        mod = vllm.output_processor_module()
        self.assertTrue(plugin.install(mod, observer))
        proc = mod.OutputProcessor(None, log_stats=True)
        (a,) = add(proc, request("a", DELTA, external="chatcmpl-gw-1", session_id="conv-9"))
        n0, n1 = add(proc, request("n", FINAL_ONLY, n=2))
        (e,) = add(proc, request("e", DELTA))
        (r,) = add(proc, request("r", DELTA))
        (o,) = add(proc, request("o", DELTA), queue=False)
        step(proc, [(a, [1], None), (n0, [1], None), (n1, [1], None), (e, [1], None), (r, [1], None),
                    (o, [1], None)])
        step(proc, [(a, [2, 3], FinishReason.STOP), (n0, [2], FinishReason.LENGTH), (n1, [2], None),
                    (e, [], FinishReason.ERROR), (r, [2], FinishReason.REPETITION)])
        step(proc, [(n1, [3], FinishReason.STOP)])
        proc.abort_requests([o], internal=True)
        self.assertTrue(client.flush(timeout=10))
        self.assertEqual(observer.errors, 0)

        want = {  # session id: outcome, output tokens, finish reason, error type
            "chatcmpl-gw-1": ("completed", 3, "stop", None),
            "chatcmpl-n#0": ("completed", 2, "length", None),
            "chatcmpl-n#1": ("completed", 3, "stop", None),
            "chatcmpl-e": ("error", 1, "error", "InternalServerError"),
            "chatcmpl-r": ("completed", 2, "repetition", None),
            "chatcmpl-o": ("aborted", 1, "abort", "aborted"),
        }

        def summaries():
            got = {a.get("llm.session.id"): a for r, a in self.sink.records()
                   if r.get("eventName") == "llm.session.summary"}
            return got if set(want) <= set(got) else None

        got = test_otelcol_llm_hook.wait_for(summaries, timeout=15, interval=0.1)
        self.assertTrue(got, "summaries at the sink: %r\ncollector log:\n%s"
                        % (sorted(a.get("llm.session.id") for _, a in self.sink.records()), self.collector_log()))
        for sid, (outcome, tokens, finish, error) in want.items():
            attrs = got[sid]
            self.assertEqual(attrs["llm.session.outcome"], outcome, sid)
            self.assertEqual(attrs["gen_ai.usage.output_tokens"], tokens, sid)
            self.assertEqual(attrs["gen_ai.response.finish_reasons"], [finish], sid)
            self.assertEqual(attrs.get("error.type"), error, sid)
        self.assertEqual(got["chatcmpl-gw-1"]["llm.session.attributes"], {"gen_ai.conversation.id": "conv-9"})
        self.assertNotIn("gen_ai.request.stream", {k for k, v in got["chatcmpl-gw-1"].items() if v is False})
        self.assertEqual(got["chatcmpl-n#0"].get("gen_ai.request.stream"), False)


class PluginShareCollectorTest(test_otelcol_llm_hook.CollectorTestCase):
    """Both halves of the plugin, each with its own client as in vLLM's two processes: the API server's output
    processor (the stand-in) sends the sessions, their starts naming vLLM's internal request ids; the engine core's
    scheduler (the stand-in, on a simulated clock) sends each request's share by that id. The built collector joins
    them: each session's summary carries the engine's share to the nanosecond (attribution_source engine)."""

    processors = {"token_session": {"sampling": {"normal_percent": 100}}}

    def test_sessions_carry_the_engine_cores_share(self):
        import otelcol_llm_vllm_steps as steps

        api = Client("unix://" + self.unix_path, flush_interval=0.01)
        self.addCleanup(api.close)
        core = Client("unix://" + self.unix_path, flush_interval=0.01)
        self.addCleanup(core.close)
        observer = plugin.Observer(api, model="llama", engine="vllm-0", engine_request_ids=True)
        mod = vllm.output_processor_module()
        self.assertTrue(plugin.install(mod, observer))
        proc = mod.OutputProcessor(None, log_stats=True)
        (a,) = add(proc, request("a", DELTA, prompt=10))
        (b,) = add(proc, request("b", DELTA, prompt=4))

        # The engine core: 8 tokens a step, 100 ns a token. Step 1: a's first 8 prompt tokens (800 ns). Step 2: a's
        # last 2 and b's 4 (600 ns: 200 to a, 400 to b); b is done. Step 3: a decodes 1 (100 ns) and is done.
        clock = vllm.SimClock()
        sched_mod = vllm.scheduler_module()
        ledger = steps.StepLedger(core, engine="vllm-0", clock=clock)
        self.assertTrue(steps.install(sched_mod, ledger))
        sched = sched_mod.Scheduler(max_num_batched_tokens=8)
        runner = vllm.ModelRunner(clock, lambda n: 100 * n)
        sched.add_request(sched_mod.Request(a, list(range(10)), 2))
        sched.add_request(sched_mod.Request(b, list(range(4)), 1))
        while sched.has_requests():
            so = sched.schedule(False)
            sched.update_from_output(so, runner(so, sched))
        self.assertEqual(ledger.sent, 2)

        step(proc, [(a, [1], None), (b, [1], FinishReason.LENGTH)])
        step(proc, [(a, [2], FinishReason.LENGTH)])
        self.assertTrue(core.flush(timeout=10))
        self.assertTrue(api.flush(timeout=10))
        self.assertEqual(api.stats()["rejected"] + core.stats()["rejected"], 0)

        want = {"chatcmpl-a": (1000e-9, 100e-9), "chatcmpl-b": (400e-9, 0.0)}

        def summaries():
            got = {at.get("llm.session.id"): at for r, at in self.sink.records()
                   if r.get("eventName") == "llm.session.summary"}
            return got if set(want) <= set(got) else None

        got = test_otelcol_llm_hook.wait_for(summaries, timeout=15, interval=0.1)
        self.assertTrue(got, "summaries at the sink: %r\ncollector log:\n%s"
                        % (sorted(at.get("llm.session.id") for _, at in self.sink.records()), self.collector_log()))
        for sid, (prefill, decode) in want.items():
            attrs = got[sid]
            self.assertEqual(attrs["llm.session.attribution_source"], "engine", sid)
            self.assertEqual(attrs["llm.session.engine_time.prefill"], prefill, sid)
            self.assertEqual(attrs["llm.session.engine_time.decode"], decode, sid)


class CheckToolTest(unittest.TestCase):
    """check_vllm.py, the maintainer's check of a vLLM source tree, on trees written here."""

    def tree(self, make_request_output_params, scheduler_output="scheduler_output"):
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        os.makedirs(os.path.join(root, "vllm", "v1", "engine"))
        with open(os.path.join(root, check_vllm.OUTPUT_PROCESSOR), "w") as f:
            f.write(
                "class RequestState:\n"
                "    def __init__(self, request_id: 'str', queue):\n"
                "        self.request_id = self.external_req_id = self.parent_req = self.request_index = None\n"
                "        self.output_kind = self.prompt_len = self.detokenizer = self.stats = None\n"
                "        self.streaming_input = False\n"
                "    def make_request_output(self, %s): pass\n"
                "class OutputProcessor:\n"
                "    def add_request(self, request: EngineCoreRequest, prompt, queue=None): pass\n"
                "    def abort_requests(self, request_ids, internal): pass\n" % make_request_output_params)
        with open(os.path.join(root, check_vllm.ENGINE), "w") as f:
            f.write("class EngineCoreRequest:\n" + "".join(
                "    %s: int\n" % n for n in ("request_id", "sampling_params", "arrival_time", "trace_headers",
                                              "resumable")))
        os.makedirs(os.path.join(root, "vllm", "v1", "core", "sched"))
        for path, text in ((check_vllm.SCHEDULER,
                            "class Scheduler:\n"
                            "    def __init__(self, vllm_config):\n"
                            "        self.requests = {}\n"
                            "        self.finished_req_ids = set()\n"
                            "    def schedule(self, throttle_prefills: bool = False): pass\n"
                            "    def update_from_output(self, %s, model_runner_output): pass\n" % scheduler_output),
                           (check_vllm.SCHEDULER_OUTPUT,
                            "class SchedulerOutput:\n    num_scheduled_tokens: dict\n    finished_req_ids: set\n"),
                           (check_vllm.REQUEST,
                            "class Request:\n    def __init__(self, request_id):\n        self.request_id = request_id\n"
                            "        self.num_prompt_tokens = self.num_computed_tokens = 0\n"),
                           (check_vllm.ENGINE_CORE,
                            "class EngineCore:\n    def __init__(self, vllm_config):\n"
                            "        from vllm.plugins import load_general_plugins\n        load_general_plugins()\n")):
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        return root

    def run_tool(self, root):
        return subprocess.run([sys.executable, "check_vllm.py", root], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)))

    def test_matching_tree(self):
        res = self.run_tool(self.tree("new_token_ids, pooling_output, finish_reason, stop_reason, extra=None"))
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertIn("RequestState.make_request_output: patched", res.stdout)
        self.assertIn("EngineCoreRequest fields read: missing session_id", res.stdout)

    def test_changed_tree(self):
        res = self.run_tool(self.tree("new_token_ids, pooling_output, reason, stop_reason"))
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("RequestState.make_request_output: REFUSED (it has no parameter 'finish_reason'", res.stdout)

    def test_engine_core_half(self):
        res = self.run_tool(self.tree("new_token_ids, pooling_output, finish_reason, stop_reason"))
        self.assertIn("Scheduler.update_from_output: patched", res.stdout)
        self.assertIn("EngineCore.__init__ loads the general plugins: yes", res.stdout)
        res = self.run_tool(self.tree("new_token_ids, pooling_output, finish_reason, stop_reason", "output"))
        self.assertEqual(res.returncode, 1, res.stdout + res.stderr)
        self.assertIn("Scheduler.update_from_output: REFUSED (it has no parameter 'scheduler_output'", res.stdout)


class InstallTest(unittest.TestCase):
    def test_pip_install_registers_the_plugin(self):
        # What a user runs, offline: pip builds the package with its own in-tree backend (standard library only:
        # no setuptools, no wheel), in pip's default isolated build environment, and vLLM's plugin loader finds
        # the entry point.
        here = os.path.dirname(os.path.abspath(__file__))
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "src")
            shutil.copytree(here, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
            target = os.path.join(tmp, "site")
            env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
            env["PIP_NO_INDEX"] = "1"
            res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", target, src],
                                 capture_output=True, text=True, cwd=tmp, env=env)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            probe = (
                "from importlib.metadata import entry_points, version\n"
                "eps = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'otelcol_llm']\n"
                "f = eps[0].load()\n"
                "import otelcol_llm_hook\n"
                "print(eps[0].value, f.__module__, otelcol_llm_hook.__file__, version('otelcol-llm-hook'))\n"
            )
            out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                                 cwd=tmp, env={**os.environ, "PYTHONPATH": target}).stdout
            value, module, path, ver = out.split()
            self.assertEqual(value, "otelcol_llm_vllm:register")
            self.assertEqual(module, "otelcol_llm_vllm")
            self.assertTrue(path.startswith(target), "the installed copy, not this folder's")
            self.assertEqual(ver, "0.1.0")
            self.assertFalse(os.path.exists(os.path.join(target, "vllm_standin.py")), "test code is not installed")


if __name__ == "__main__":
    unittest.main()
