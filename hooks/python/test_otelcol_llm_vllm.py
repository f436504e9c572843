"""Tests of otelcol_llm_vllm, the vLLM plugin: run with `python3 -m unittest -v` in this folder.

vLLM cannot be installed here, so the tests install stand-ins of the vLLM modules the plugin touches, shaped
exactly as vLLM's at commit d07822605346f767b672503c9aae85aa23ef2d82:

- vllm/sampling_params.py: ``RequestOutputKind`` (CUMULATIVE = 0, DELTA = 1, FINAL_ONLY = 2);
- vllm/v1/engine/__init__.py: ``FinishReason`` (STOP, LENGTH, ABORT, ERROR; ``str()`` is the lower-case name);
- vllm/v1/metrics/stats.py: ``RequestStateStats`` (arrival_time, queued_ts, scheduled_ts, first_token_ts,
  last_token_ts, num_generation_tokens);
- vllm/outputs.py: ``CompletionOutput`` and ``RequestOutput`` (the fields the output processor sets);
- vllm/v1/engine/output_processor.py: ``RequestState`` (``make_request_output(new_token_ids, pooling_output,
  finish_reason, stop_reason, kv_transfer_params=None, routed_experts=None)``, with its FINAL_ONLY,
  stream_interval and DELTA/cumulative token_ids logic as written there) and ``OutputProcessor``
  (``add_request(request, prompt, parent_req=None, request_index=0, queue=None)``, ``process_outputs`` and
  ``abort_requests`` as there, without detokenization or logprobs).
"""

import enum
import os
import sys
import time
import types
import unittest
from dataclasses import dataclass, field
from unittest import mock

import otelcol_llm_vllm as plugin
from otelcol_llm_hook import Client
from test_otelcol_llm_hook import UDPSink

# ---- stand-ins of vLLM, as at d07822605346f767b672503c9aae85aa23ef2d82 ----


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3

    def __str__(self):
        return ("stop", "length", "abort", "error")[self.value]


@dataclass
class RequestStateStats:
    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float = None
    logprobs: list = None
    finish_reason: str = None
    stop_reason: object = None
    routed_experts: object = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list
    prompt_logprobs: list
    outputs: list
    finished: bool
    metrics: object = None
    lora_request: object = None
    kv_transfer_params: object = None
    num_cached_tokens: int = 0


@dataclass
class SamplingParams:
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    max_tokens: int = 16
    detokenize: bool = True


@dataclass
class EngineCoreRequest:
    request_id: str
    external_req_id: str
    prompt_token_ids: list
    sampling_params: SamplingParams
    arrival_time: float
    trace_headers: dict = None
    resumable: bool = False
    lora_request: object = None


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list
    finish_reason: FinishReason = None
    stop_reason: object = None
    pooling_output: object = None
    kv_transfer_params: object = None
    routed_experts: object = None
    num_cached_tokens: int = 0
    finished: bool = field(init=False)

    def __post_init__(self):
        self.finished = self.finish_reason is not None


class _Detokenizer:
    def __init__(self):
        self.output_token_ids = []

    def update(self, new_token_ids, stop_terminated):
        self.output_token_ids.extend(new_token_ids)
        return None


class RequestState:
    def __init__(self, request, request_index, queue, log_stats, stream_interval):
        self.request_id = request.request_id
        self.external_req_id = request.external_req_id
        self.parent_req = None
        self.request_index = request_index
        self.output_kind = request.sampling_params.output_kind
        self.prompt_token_ids = request.prompt_token_ids
        self.prompt_len = len(request.prompt_token_ids)
        self.detokenizer = _Detokenizer()
        self.is_prefilling = True
        self.queue = queue
        self.stats = RequestStateStats(arrival_time=request.arrival_time) if log_stats else None
        self.stream_interval = stream_interval
        self.sent_tokens_offset = 0
        self.streaming_input = False

    def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                            kv_transfer_params=None, routed_experts=None):
        # As vLLM's: FINAL_ONLY makes nothing until the end; stream_interval > 1 holds tokens back (DELTA sends
        # them from the offset); CUMULATIVE sends every token so far.
        finished = finish_reason is not None
        if not finished and self.output_kind == RequestOutputKind.FINAL_ONLY:
            return None
        if self.stream_interval > 1:
            if not (finished or self.sent_tokens_offset == 0
                    or len(self.detokenizer.output_token_ids) - self.sent_tokens_offset >= self.stream_interval):
                return None
            if self.output_kind == RequestOutputKind.DELTA:
                new_token_ids = self.detokenizer.output_token_ids[self.sent_tokens_offset:]
                self.sent_tokens_offset = len(self.detokenizer.output_token_ids)
        delta = self.output_kind == RequestOutputKind.DELTA
        token_ids = new_token_ids if delta else self.detokenizer.output_token_ids
        out = CompletionOutput(index=self.request_index, text="", token_ids=list(token_ids),
                               finish_reason=str(finish_reason) if finished else None)
        return RequestOutput(request_id=self.external_req_id, prompt=None, prompt_token_ids=self.prompt_token_ids,
                             prompt_logprobs=None, outputs=[out], finished=finished, metrics=self.stats)


class OutputProcessor:
    def __init__(self, tokenizer=None, log_stats=True, stream_interval=1):
        self.log_stats = log_stats
        self.stream_interval = stream_interval
        self.request_states = {}

    def add_request(self, request, prompt, parent_req=None, request_index=0, queue=None):
        if request.request_id in self.request_states:
            return
        self.request_states[request.request_id] = RequestState(request, request_index, queue, self.log_stats,
                                                               self.stream_interval)

    def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None):
        request_outputs = []
        for eco in engine_core_outputs:
            req_state = self.request_states.get(eco.request_id)
            if req_state is None:
                continue
            now = time.monotonic()
            st = req_state.stats
            if st is not None:  # as IterationStats.update_from_output does
                if req_state.is_prefilling and eco.new_token_ids:
                    st.first_token_ts = now
                if eco.new_token_ids:
                    st.last_token_ts = now
                    st.num_generation_tokens += len(eco.new_token_ids)
            req_state.is_prefilling = False
            req_state.detokenizer.update(eco.new_token_ids, eco.finish_reason == FinishReason.STOP)
            if request_output := req_state.make_request_output(eco.new_token_ids, eco.pooling_output,
                                                               eco.finish_reason, eco.stop_reason,
                                                               eco.kv_transfer_params, eco.routed_experts):
                request_outputs.append(request_output)
            if eco.finish_reason is not None:
                self.request_states.pop(eco.request_id)
        return request_outputs

    def abort_requests(self, request_ids, internal, error=None):
        aborted = []
        for request_id in request_ids:
            req_state = self.request_states.pop(request_id, None)
            if req_state is not None:
                aborted.append(request_id)
                req_state.make_request_output(new_token_ids=[], pooling_output=None,
                                              finish_reason=FinishReason.ABORT, stop_reason=None,
                                              kv_transfer_params=None)
        return aborted


def fake_vllm():
    """The stand-in modules, under the names the plugin imports."""
    op = types.ModuleType("vllm.v1.engine.output_processor")
    op.OutputProcessor, op.RequestState, op.RequestOutputCollector = OutputProcessor, RequestState, object
    names = ["vllm", "vllm.v1", "vllm.v1.engine"]
    mods = {n: types.ModuleType(n) for n in names}
    mods["vllm.v1.engine"].output_processor = op
    mods["vllm.v1.engine.output_processor"] = op
    return mods


# ---- tests ----


def request(rid, kind, *, prompt=12, headers=None):
    # vLLM stamps arrival_time with time.time(); the stats' *_ts with time.monotonic().
    return EngineCoreRequest(request_id=rid, external_req_id="chatcmpl-" + rid, prompt_token_ids=list(range(prompt)),
                             sampling_params=SamplingParams(output_kind=kind), arrival_time=time.time(),
                             trace_headers=headers)


class PluginTest(unittest.TestCase):
    def setUp(self):
        self.sink = UDPSink()
        self.client = Client(self.sink.endpoint, flush_interval=0.01)
        self.observer = plugin.Observer(self.client, model="llama", engine="vllm-0")
        # A fresh OutputProcessor class per test: install wraps the class it is given.
        self.mod = types.SimpleNamespace(OutputProcessor=type("OutputProcessor", (OutputProcessor,), {}),
                                         RequestState=type("RequestState", (RequestState,), {}))
        self.assertTrue(plugin.install(self.mod, self.observer))
        self.assertFalse(plugin.install(self.mod, self.observer), "idempotent")

    def tearDown(self):
        self.client.close()
        self.sink.close()

    def run_request(self, kind, steps, *, stream_interval=1, rid="r1", headers=None):
        """Drive one request through the output processor: steps are lists of new token ids; the last ends it."""
        proc = self.mod.OutputProcessor(stream_interval=stream_interval)
        proc.add_request(request(rid, kind, headers=headers), None)
        # RequestState objects of the wrapped class: make them so.
        state = proc.request_states[rid]
        state.__class__ = self.mod.RequestState
        st = state.stats
        st.queued_ts = time.monotonic()
        time.sleep(0.002)
        st.scheduled_ts = time.monotonic()
        for i, new in enumerate(steps):
            last = i == len(steps) - 1
            proc.process_outputs([EngineCoreOutput(request_id=rid, new_token_ids=new,
                                                   finish_reason=FinishReason.LENGTH if last else None)])
        return st

    def events(self, n):
        import json

        return [json.loads(line) for line in self.sink.lines(n)]

    def assert_session(self, evs, tokens, *, stream=True):
        self.assertEqual(evs[0]["event"], "start")
        self.assertEqual(evs[0]["prompt_tokens"], 12)
        self.assertEqual(evs[0]["model"], "llama")
        self.assertEqual(evs[0].get("stream", True), stream)
        counted = sum(e.get("count", 1) for e in evs if e["event"] == "token")
        self.assertEqual(counted, tokens)
        end = evs[-1]
        self.assertEqual(end["event"], "end")
        self.assertEqual(end["completion_tokens"], tokens)
        self.assertEqual(end["finish_reason"], "length")
        for k in ("queue_time_ns", "prefill_time_ns", "decode_time_ns"):
            self.assertIn(k, end)
            self.assertGreaterEqual(end[k], 0)
        self.assertGreaterEqual(end["queue_time_ns"], 2_000_000, "the 2 ms between queued and scheduled")

    def test_delta(self):
        # What vLLM's OpenAI server streams: each output carries only its new tokens.
        self.run_request(RequestOutputKind.DELTA, [[1], [2, 3], [4], [5]])
        evs = self.events(6)
        self.assert_session(evs, 5)
        self.assertEqual([e.get("count", 1) for e in evs if e["event"] == "token"], [1, 2, 1, 1])

    def test_cumulative(self):
        # AsyncLLM.generate's default: each output carries every token so far; the growth is counted.
        self.run_request(RequestOutputKind.CUMULATIVE, [[1], [2, 3], [4], [5]])
        evs = self.events(6)
        self.assert_session(evs, 5)
        self.assertEqual([e.get("count", 1) for e in evs if e["event"] == "token"], [1, 2, 1, 1])

    def test_final_only(self):
        # A request that does not stream: one output at the end, the session marked stream: false.
        self.run_request(RequestOutputKind.FINAL_ONLY, [[1], [2, 3], [4], [5]])
        evs = self.events(3)
        self.assert_session(evs, 5, stream=False)

    def test_stream_interval(self):
        # --stream-interval 3: outputs carry several tokens (DELTA from the offset).
        self.run_request(RequestOutputKind.DELTA, [[1], [2], [3], [4], [5], [6], [7]], stream_interval=3)
        evs = self.events(5)
        self.assert_session(evs, 7)
        self.assertEqual([e.get("count", 1) for e in evs if e["event"] == "token"], [1, 3, 3])

    def test_abort_and_trace_context(self):
        proc = self.mod.OutputProcessor()
        headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "ot=th:8"}
        proc.add_request(request("r2", RequestOutputKind.DELTA, headers=headers), None)
        proc.request_states["r2"].__class__ = self.mod.RequestState
        proc.process_outputs([EngineCoreOutput(request_id="r2", new_token_ids=[9])])
        proc.abort_requests(["r2"], internal=True)
        evs = self.events(3)
        self.assertEqual(evs[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736")
        self.assertEqual(evs[0]["parent_span_id"], "00f067aa0ba902b7")
        self.assertEqual(evs[0]["tracestate"], "ot=th:8")
        self.assertEqual(evs[2]["finish_reason"], "abort")
        self.assertEqual(evs[2]["completion_tokens"], 1)

    def test_never_raises_into_vllm(self):
        # Anything failing in the plugin (here its client) is counted and logged once; vLLM's loop goes on
        # with its outputs untouched.
        class Broken:
            def start(self, *a, **k):
                raise RuntimeError("boom")

            token = end = start

        observer = plugin.Observer(Broken())
        mod = types.SimpleNamespace(OutputProcessor=type("OutputProcessor", (OutputProcessor,), {}),
                                    RequestState=type("RequestState", (RequestState,), {}))
        plugin.install(mod, observer)
        proc = mod.OutputProcessor()
        with self.assertLogs("otelcol_llm_hook.vllm", "WARNING") as logs:
            proc.add_request(request("r3", RequestOutputKind.CUMULATIVE), None)
            proc.request_states["r3"].__class__ = mod.RequestState
            proc.request_states["r3"].__dict__[plugin._SEEN] = 0  # as if the start had gone out
            out = proc.process_outputs([EngineCoreOutput(request_id="r3", new_token_ids=[1, 2], finish_reason=FinishReason.STOP)])
        self.assertEqual([o.outputs[0].token_ids for o in out], [[1, 2]])
        self.assertEqual(observer.errors, 2, "the start and the token")
        self.assertEqual(len(logs.output), 1, "logged once")


class RegisterTest(unittest.TestCase):
    def test_off_without_endpoint(self):
        with mock.patch.dict(os.environ, {}, clear=False), mock.patch.dict(sys.modules, fake_vllm()):
            os.environ.pop(plugin.ENV_ENDPOINT, None)
            before = OutputProcessor.add_request
            plugin.register()
            self.assertIs(OutputProcessor.add_request, before, "installing the package changes nothing by itself")

    def test_register_wraps_vllm(self):
        sink = UDPSink()
        saved = (OutputProcessor.add_request, RequestState.make_request_output, plugin._observer)
        try:
            with mock.patch.dict(os.environ, {plugin.ENV_ENDPOINT: sink.endpoint, "OTELCOL_LLM_HOOK_MODEL": "m"}), \
                    mock.patch.dict(sys.modules, fake_vllm()):
                plugin._observer = None
                plugin.register()
                plugin.register()  # vLLM may load general plugins more than once
                self.assertTrue(getattr(OutputProcessor.add_request, "_otelcol_llm_wrapped", False))
                self.assertIsNone(plugin.stats(), "no client until the first request")
                proc = OutputProcessor()
                proc.add_request(request("g1", RequestOutputKind.DELTA), None)
                proc.process_outputs([EngineCoreOutput(request_id="g1", new_token_ids=[1, 2], finish_reason=FinishReason.STOP)])
                lines = sink.lines(3)
                self.assertIn('"model":"m"', lines[0])
                self.assertIn('"count":2', lines[1])
                self.assertEqual(plugin.stats()["errors"], 0)
                plugin._observer.client.close()
        finally:
            OutputProcessor.add_request, RequestState.make_request_output, plugin._observer = saved
            sink.close()


class InstallTest(unittest.TestCase):
    def test_pip_install_registers_the_plugin(self):
        # What a user runs, here offline: the package builds from pyproject.toml with the setuptools at hand, and
        # vLLM's plugin loader finds the entry point. Building a wheel takes the `wheel` package next to an older
        # setuptools: this interpreter's, else Debian's python3-wheel (.ci/run installs it).
        import shutil
        import subprocess
        import tempfile

        env = dict(os.environ)
        with tempfile.TemporaryDirectory() as tmp:
            try:
                import wheel  # noqa: F401
            except ImportError:
                debian = "/usr/lib/python3/dist-packages"
                found = [d for d in os.listdir(debian) if d == "wheel" or d.startswith("wheel-")] if os.path.isdir(debian) else []
                if "wheel" not in found:
                    self.skipTest("no `wheel` package: pip cannot build the package without the network")
                shim = os.path.join(tmp, "wheel-shim")
                os.mkdir(shim)
                for d in found:  # the package and its metadata, which registers bdist_wheel
                    os.symlink(os.path.join(debian, d), os.path.join(shim, d))
                env["PYTHONPATH"] = shim
            # A copy of the sources: building writes build/ and *.egg-info next to them.
            here = os.path.dirname(os.path.abspath(__file__))
            src = os.path.join(tmp, "src")
            os.mkdir(src)
            for f in ("pyproject.toml", "README.md", "otelcol_llm_hook.py", "otelcol_llm_vllm.py"):
                shutil.copy(os.path.join(here, f), src)
            target = os.path.join(tmp, "site")
            res = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
                                  "--no-index", "--target", target, src], capture_output=True, text=True, cwd=tmp, env=env)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
            probe = (
                "from importlib.metadata import entry_points\n"
                "eps = [e for e in entry_points(group='vllm.general_plugins') if e.name == 'otelcol_llm']\n"
                "f = eps[0].load()\n"
                "import otelcol_llm_hook\n"
                "print(eps[0].value, f.__module__, otelcol_llm_hook.__file__)\n"
            )
            out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True,
                                 cwd=tmp, env={**os.environ, "PYTHONPATH": target}).stdout
            value, module, path = out.split()
            self.assertEqual(value, "otelcol_llm_vllm:register")
            self.assertEqual(module, "otelcol_llm_vllm")
            self.assertTrue(path.startswith(target), "the installed copy, not this folder's")


if __name__ == "__main__":
    unittest.main()
