"""Stand-ins of the vLLM objects the plugin touches, for its tests and its benchmark.

vLLM cannot be installed here (it needs torch and a GPU build), so these are written to be shaped exactly as
vLLM's at the commit in ``VLLM_COMMIT`` (on vLLM's main branch): the same class and method names, the same
signatures, the same attributes, and the same control flow where it decides which outputs are made and when a
request leaves, with detokenization, logprobs, LoRA and tracing left out:

- vllm/sampling_params.py: ``RequestOutputKind``;
- vllm/v1/engine/__init__.py: ``FinishReason`` (``str()`` is the lower-case name), ``EngineCoreRequest`` (the
  fields the output processor reads, ``session_id`` included), ``EngineCoreOutput``;
- vllm/v1/metrics/stats.py: ``RequestStateStats``, ``PrefillStats``;
- vllm/outputs.py: ``CompletionOutput``, ``RequestOutput``, ``STREAM_FINISHED``;
- vllm/v1/engine/detokenizer.py: ``IncrementalDetokenizer`` without a tokenizer (it keeps the token ids);
- vllm/v1/engine/parallel_sampling.py: ``ParentRequest`` (child ids, ``get_outputs``' FINAL_ONLY aggregation);
- vllm/v1/engine/output_processor.py: ``RequestOutputCollector``, ``StreamingUpdate``, ``RequestState``
  (``from_new_request``, ``apply_streaming_update``, ``make_request_output``) and ``OutputProcessor``
  (``__init__``, ``add_request`` with streaming-input updates, ``abort_requests``, ``process_outputs``,
  ``_finish_request``);
- vllm/plugins/__init__.py: ``load_general_plugins`` and ``load_plugins_by_group``: entry points of the group
  ``vllm.general_plugins``, filtered by ``VLLM_PLUGINS``, each loaded under a ``try`` and then called without one.

``output_processor_module()`` makes a fresh module of the output processor's classes for each use, since the plugin
patches the classes it is given. The drivers at the end do what vLLM's ``AsyncLLM`` and ``LLMEngine`` do around
the output processor (add a request, or its n children; feed engine outputs; abort).
"""

import enum
import os
import time
import types
from collections import defaultdict, deque
from copy import copy
from dataclasses import dataclass, field

# The vLLM main commit these were last compared with, and its date.
VLLM_COMMIT = "7cfb97e33791a348cd5d7b622cca521d82d8399f"
VLLM_COMMIT_DATE = "2026-08-20"

# ---- vllm/sampling_params.py ----


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


@dataclass
class SamplingParams:
    n: int = 1
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    max_tokens: int = 16
    detokenize: bool = True
    stream_interval: int = None
    seed: int = None


# ---- vllm/v1/engine/__init__.py ----

FINISH_REASON_STRINGS = ("stop", "length", "abort", "error", "repetition")


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2
    ERROR = 3
    REPETITION = 4

    def __str__(self):
        return FINISH_REASON_STRINGS[self.value]


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list
    sampling_params: SamplingParams
    arrival_time: float
    pooling_params: object = None
    lora_request: object = None
    trace_headers: dict = None
    resumable: bool = False
    external_req_id: str = None
    session_id: str = None
    prompt_embeds: object = None

    @property
    def params(self):
        return self.sampling_params if self.sampling_params is not None else self.pooling_params


@dataclass
class PrefillStats:
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_local_cached_tokens: int = 0
    num_external_cached_tokens: int = 0
    num_cache_creation_tokens: int = 0


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list
    finish_reason: FinishReason = None
    stop_reason: object = None
    pooling_output: object = None
    kv_transfer_params: object = None
    ec_transfer_params: object = None
    routed_experts: object = None
    prefill_stats: PrefillStats = None

    @property
    def finished(self):
        return self.finish_reason is not None


# ---- vllm/v1/metrics/stats.py ----


@dataclass
class RequestStateStats:
    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    is_corrupted: bool = False


# ---- vllm/outputs.py ----


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list
    cumulative_logprob: float = None
    logprobs: list = None
    routed_experts: object = None
    finish_reason: str = None
    stop_reason: object = None
    lora_request: object = None

    def finished(self):
        return self.finish_reason is not None


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
    ec_transfer_params: object = None
    num_cached_tokens: int = 0


# Put on a streaming-input request's queue when vLLM ends it without another output.
STREAM_FINISHED = RequestOutput(request_id="", prompt=None, prompt_token_ids=None, prompt_logprobs=None, outputs=[],
                                finished=True)


# ---- vllm/v1/engine/detokenizer.py (no tokenizer: token ids only) ----


class IncrementalDetokenizer:
    def __init__(self):
        self.token_ids = []

    @property
    def output_token_ids(self):
        return self.token_ids

    def num_output_tokens(self):
        return len(self.token_ids)

    def update(self, new_token_ids, stop_terminated):
        self.token_ids.extend(new_token_ids)
        return None

    def get_next_output_text(self, finished, delta):
        return ""


# ---- vllm/v1/engine/parallel_sampling.py ----


class ParentRequest:
    def __init__(self, request):
        assert request.external_req_id is not None
        self.request_id = request.request_id
        self.external_req_id = request.external_req_id
        self.sampling_params = request.params
        self.child_requests = set()
        final_only = self.sampling_params.output_kind == RequestOutputKind.FINAL_ONLY
        self.output_aggregator = [None] * self.sampling_params.n if final_only else []

    def get_child_info(self, index):
        child_req_id = "%d_%s" % (index, self.request_id)
        self.child_requests.add(child_req_id)
        params = copy(self.sampling_params)
        params.n = 1
        return child_req_id, params

    @property
    def n(self):
        return self.sampling_params.n

    def get_outputs(self, child_request_id, completion_output):
        already_finished_and_returned = False
        if completion_output.finished():
            if child_request_id in self.child_requests:
                self.child_requests.remove(child_request_id)
            else:
                already_finished_and_returned = True
        if self.sampling_params.output_kind != RequestOutputKind.FINAL_ONLY:
            outputs = [] if already_finished_and_returned else [completion_output]
        else:
            self.output_aggregator[completion_output.index] = completion_output
            outputs = [] if self.child_requests else self.output_aggregator
        finished = not self.child_requests
        return outputs, finished


# ---- vllm/v1/engine/output_processor.py ----


class RequestOutputCollector:
    """The per-request queue of AsyncLLM (here it keeps every output, unmerged)."""

    def __init__(self, output_kind, request_id):
        self.request_id = request_id
        self.items = []

    def put(self, output):
        self.items.append(output)


@dataclass
class StreamingUpdate:
    prompt: str
    prompt_token_ids: list
    arrival_time: float
    final: bool = False


@dataclass
class OutputProcessorOutput:
    request_outputs: list
    reqs_to_abort: list


def output_processor_module():
    """A fresh ``vllm.v1.engine.output_processor`` module: its own RequestState and OutputProcessor classes."""

    class RequestState:
        def __init__(self, request_id, external_req_id, parent_req, request_index, lora_request, output_kind,
                     prompt, prompt_token_ids, prompt_embeds, logprobs_processor, detokenizer, max_tokens_param,
                     arrival_time, queue, log_stats, stream_interval, top_p=None, n=None, temperature=None,
                     stream_input=False):
            self.request_id = request_id
            self.external_req_id = external_req_id
            self.parent_req = parent_req
            self.request_index = request_index
            self.lora_request = lora_request
            self.lora_name = None
            self.output_kind = output_kind
            self.prompt = prompt
            self.prompt_token_ids = prompt_token_ids
            self.prompt_embeds = prompt_embeds
            self.prompt_len = len(prompt_token_ids) if prompt_token_ids is not None else 0
            self.logprobs_processor = logprobs_processor
            self.detokenizer = detokenizer
            self.max_tokens_param = max_tokens_param
            self.top_p, self.n, self.temperature = top_p, n, temperature
            self.is_prefilling = True
            self.queue = queue
            self.num_cached_tokens = 0
            self.num_cache_creation_tokens = 0
            self.stats = RequestStateStats(arrival_time=arrival_time) if log_stats else None
            self.stream_interval = stream_interval
            self.sent_tokens_offset = 0
            self.streaming_input = stream_input
            self.input_chunk_queue = deque() if stream_input else None

        def apply_streaming_update(self, update):
            self.streaming_input = not update.final
            if self.prompt_token_ids:
                self.prompt_token_ids.extend(update.prompt_token_ids or ())
            else:
                self.prompt_token_ids = update.prompt_token_ids or []
            self.prompt_len = len(self.prompt_token_ids)
            if self.stats is not None:
                self.stats.arrival_time = update.arrival_time
            self.is_prefilling = True

        @classmethod
        def from_new_request(cls, tokenizer, request, prompt, parent_req, request_index, queue, log_stats,
                             stream_interval):
            if sampling_params := request.sampling_params:
                output_kind = sampling_params.output_kind
                if sampling_params.stream_interval is not None:
                    stream_interval = max(sampling_params.stream_interval, stream_interval)
                detokenizer = IncrementalDetokenizer()
                max_tokens_param, n = sampling_params.max_tokens, sampling_params.n
            else:
                detokenizer = None
                max_tokens_param = n = None
                output_kind = request.pooling_params.output_kind
            assert request.external_req_id is not None
            return cls(request_id=request.request_id, external_req_id=request.external_req_id,
                       parent_req=parent_req, request_index=request_index, lora_request=request.lora_request,
                       output_kind=output_kind, prompt=prompt, prompt_token_ids=request.prompt_token_ids,
                       prompt_embeds=request.prompt_embeds, logprobs_processor=None, detokenizer=detokenizer,
                       max_tokens_param=max_tokens_param, n=n, arrival_time=request.arrival_time, queue=queue,
                       log_stats=log_stats, stream_interval=stream_interval, stream_input=request.resumable)

        def make_request_output(self, new_token_ids, pooling_output, finish_reason, stop_reason,
                                kv_transfer_params=None, ec_transfer_params=None):
            finished = finish_reason is not None
            final_only = self.output_kind == RequestOutputKind.FINAL_ONLY
            if not finished and final_only:
                return None
            if self.stream_interval > 1:
                if not (finished or self.sent_tokens_offset == 0
                        or self.detokenizer.num_output_tokens() - self.sent_tokens_offset >= self.stream_interval):
                    return None
                if self.output_kind == RequestOutputKind.DELTA:
                    new_token_ids = self.detokenizer.output_token_ids[self.sent_tokens_offset:]
                    self.sent_tokens_offset = self.detokenizer.num_output_tokens()
            external_req_id = self.external_req_id
            if pooling_output is not None:
                return RequestOutput(request_id=external_req_id, prompt=None, prompt_token_ids=self.prompt_token_ids,
                                     prompt_logprobs=None, outputs=[], finished=finished)
            output = self._new_completion_output(new_token_ids, finish_reason, stop_reason)
            if self.parent_req is None:
                outputs = [output]
            else:
                outputs, finished = self.parent_req.get_outputs(self.request_id, output)
                if not outputs:
                    return None
                external_req_id = self.parent_req.external_req_id
            return RequestOutput(request_id=external_req_id, prompt=self.prompt,
                                 prompt_token_ids=self.prompt_token_ids, prompt_logprobs=None, outputs=list(outputs),
                                 finished=finished, kv_transfer_params=kv_transfer_params,
                                 ec_transfer_params=ec_transfer_params, num_cached_tokens=self.num_cached_tokens,
                                 metrics=self.stats)

        def _new_completion_output(self, token_ids, finish_reason, stop_reason):
            finished = finish_reason is not None
            delta = self.output_kind == RequestOutputKind.DELTA
            if not delta:
                token_ids = self.detokenizer.output_token_ids
            return CompletionOutput(index=self.request_index, text="", token_ids=list(token_ids),
                                    finish_reason=str(finish_reason) if finished else None,
                                    stop_reason=stop_reason if finished else None)

    class OutputProcessor:
        def __init__(self, tokenizer, *, log_stats, stream_interval=1, tracing_enabled=False):
            self.log_stats = log_stats
            self.tokenizer = tokenizer
            self.stream_interval = stream_interval
            self.request_states = {}
            self.parent_requests = {}
            self.external_req_ids = defaultdict(list)
            self.tracing_enabled = tracing_enabled

        def get_num_unfinished_requests(self):
            return len(self.request_states)

        def abort_requests(self, request_ids, internal):
            internal_req_ids = []
            for request_id in request_ids:
                if internal:
                    internal_req_ids.append(request_id)
                    if req_state := self.request_states.get(request_id):
                        internal_ids = self.external_req_ids[req_state.external_req_id]
                        internal_ids.remove(request_id)
                        if not internal_ids:
                            del self.external_req_ids[req_state.external_req_id]
                elif internal_ids := self.external_req_ids.pop(request_id, []):
                    internal_req_ids.extend(internal_ids)
            request_ids_to_abort = []
            for request_id in internal_req_ids:
                req_state = self.request_states.pop(request_id, None)
                if req_state is not None:
                    request_ids_to_abort.append(request_id)
                    # Only a request with a queue (AsyncLLM) gets an abort output.
                    if req_state.queue is not None and (
                        request_output := req_state.make_request_output(
                            new_token_ids=[], pooling_output=None if req_state.detokenizer is not None else [],
                            finish_reason=FinishReason.ABORT, stop_reason=None, kv_transfer_params=None,
                            ec_transfer_params=None)):
                        req_state.queue.put(request_output)
                elif parent := self.parent_requests.get(request_id):
                    if parent.child_requests:
                        request_ids_to_abort.extend(self.abort_requests(list(parent.child_requests), internal=True))
                    self.parent_requests.pop(request_id, None)
            return request_ids_to_abort

        def add_request(self, request, prompt, parent_req=None, request_index=0, queue=None):
            request_id = request.request_id
            req_state = self.request_states.get(request_id)
            if req_state is not None:
                self._update_streaming_request_state(req_state, request, prompt)
                return
            req_state = RequestState.from_new_request(
                tokenizer=self.tokenizer, request=request, prompt=prompt, parent_req=parent_req,
                request_index=request_index, queue=queue, log_stats=self.log_stats,
                stream_interval=self.stream_interval)
            self.request_states[request_id] = req_state
            if parent_req:
                self.parent_requests[parent_req.request_id] = parent_req
            self.external_req_ids[req_state.external_req_id].append(request_id)

        def _update_streaming_request_state(self, req_state, request, prompt):
            if not request.resumable:
                if req_state.input_chunk_queue is None:
                    self._finish_request(req_state)
                    if req_state.queue is not None:
                        req_state.queue.put(STREAM_FINISHED)
                elif req_state.input_chunk_queue:
                    req_state.input_chunk_queue[-1].final = True
                else:
                    req_state.streaming_input = False
                return
            update = StreamingUpdate(prompt=prompt, prompt_token_ids=request.prompt_token_ids,
                                     arrival_time=request.arrival_time)
            if req_state.input_chunk_queue is None:
                req_state.apply_streaming_update(update)
                req_state.input_chunk_queue = deque()
            else:
                req_state.input_chunk_queue.append(update)

        def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None):
            request_outputs = []
            reqs_to_abort = []
            for engine_core_output in engine_core_outputs:
                req_id = engine_core_output.request_id
                req_state = self.request_states.get(req_id)
                if req_state is None:
                    continue
                self._update_stats_from_output(req_state, engine_core_output)
                new_token_ids = engine_core_output.new_token_ids
                pooling_output = engine_core_output.pooling_output
                finish_reason = engine_core_output.finish_reason
                stop_reason = engine_core_output.stop_reason
                kv_transfer_params = engine_core_output.kv_transfer_params
                ec_transfer_params = engine_core_output.ec_transfer_params
                if req_state.is_prefilling:
                    if engine_core_output.prefill_stats is not None:
                        req_state.num_cached_tokens = engine_core_output.prefill_stats.num_cached_tokens
                        req_state.num_cache_creation_tokens = (
                            engine_core_output.prefill_stats.num_cache_creation_tokens)
                    req_state.is_prefilling = False
                if pooling_output is None:
                    req_state.detokenizer.update(new_token_ids, finish_reason == FinishReason.STOP)
                if request_output := req_state.make_request_output(new_token_ids, pooling_output, finish_reason,
                                                                   stop_reason, kv_transfer_params,
                                                                   ec_transfer_params):
                    if req_state.streaming_input:
                        request_output.finished = False
                    if req_state.queue is not None:
                        req_state.queue.put(request_output)
                    else:
                        request_outputs.append(request_output)
                if finish_reason is not None:
                    if req_state.streaming_input:
                        if req_state.input_chunk_queue:
                            update = req_state.input_chunk_queue.popleft()
                            req_state.apply_streaming_update(update)
                        else:
                            req_state.input_chunk_queue = None
                    else:
                        self._finish_request(req_state)
                        if not engine_core_output.finished:
                            reqs_to_abort.append(req_id)
            return OutputProcessorOutput(request_outputs=request_outputs, reqs_to_abort=reqs_to_abort)

        def _finish_request(self, req_state):
            req_id = req_state.request_id
            self.request_states.pop(req_id)
            internal_ids = self.external_req_ids[req_state.external_req_id]
            internal_ids.remove(req_id)
            if not internal_ids:
                del self.external_req_ids[req_state.external_req_id]
            parent_req = req_state.parent_req
            if parent_req and not parent_req.child_requests:
                self.parent_requests.pop(parent_req.request_id, None)

        def _update_stats_from_output(self, req_state, engine_core_output):
            # As IterationStats.update_from_output: the first and last token times, on the monotonic clock.
            st = req_state.stats
            if st is None:
                return
            now = time.monotonic()
            if engine_core_output.new_token_ids:
                if req_state.is_prefilling:
                    st.first_token_ts = now
                st.last_token_ts = now
                st.num_generation_tokens += len(engine_core_output.new_token_ids)

    mod = types.ModuleType("vllm.v1.engine.output_processor")
    for name, obj in (("RequestState", RequestState), ("OutputProcessor", OutputProcessor),
                      ("RequestOutputCollector", RequestOutputCollector), ("StreamingUpdate", StreamingUpdate),
                      ("OutputProcessorOutput", OutputProcessorOutput), ("FinishReason", FinishReason),
                      ("RequestOutputKind", RequestOutputKind)):
        setattr(mod, name, obj)
    return mod


def vllm_modules(output_processor=None, scheduler=None, engine_core=None):
    """The stand-in package tree under the names the plugin imports (for ``sys.modules``)."""
    op = output_processor or output_processor_module()
    sched = scheduler or scheduler_module()
    core = engine_core or engine_core_module()
    mods = {n: types.ModuleType(n) for n in ("vllm", "vllm.v1", "vllm.v1.engine", "vllm.plugins", "vllm.v1.core",
                                             "vllm.v1.core.sched")}
    mods["vllm"].v1 = mods["vllm.v1"]
    mods["vllm.v1"].engine = mods["vllm.v1.engine"]
    mods["vllm.v1"].core = mods["vllm.v1.core"]
    mods["vllm.v1.core"].sched = mods["vllm.v1.core.sched"]
    mods["vllm.v1.core.sched"].scheduler = sched
    mods["vllm.v1.core.sched.scheduler"] = sched
    mods["vllm.v1.engine"].core = core
    mods["vllm.v1.engine.core"] = core
    mods["vllm.v1.engine"].output_processor = op
    mods["vllm.v1.engine.output_processor"] = op
    mods["vllm.plugins"].load_general_plugins = load_general_plugins
    return mods


# ---- vllm/plugins/__init__.py ----

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"


def load_plugins_by_group(group):
    from importlib.metadata import entry_points

    plugins_env = os.environ.get("VLLM_PLUGINS")
    allowed_plugins = None if plugins_env is None else plugins_env.split(",")
    plugins = {}
    for plugin in entry_points(group=group):
        if allowed_plugins is None or plugin.name in allowed_plugins:
            try:
                plugins[plugin.name] = plugin.load()
            except Exception:
                pass  # vLLM logs "Failed to load plugin %s" and goes on
    return plugins


def load_general_plugins():
    # As vLLM's: the functions are called without a try, so a plugin that raises stops vLLM's start.
    for func in load_plugins_by_group(group=DEFAULT_PLUGINS_GROUP).values():
        func()


# ---- vllm/v1/request.py, vllm/v1/core/sched/output.py, vllm/v1/core/sched/scheduler.py ----
#
# Compared with vLLM main at SCHEDULER_COMMIT: what the engine-core part of the plugin reads and the control flow
# that decides it, with the KV cache reduced to a token budget, and encoders, spec decode, structured output,
# connectors, LoRA and stats left out. schedule() serves the running requests first (chunked prefill under the
# step's token budget), pre-empts the last running request when the KV cache cannot hold a running one's new
# tokens (_preempt_request: back to the front of the waiting queue with num_computed_tokens reset to 0, so its
# prompt and the tokens it generated are computed again), and admits waiting requests only in a step without a
# pre-emption; _update_after_schedule advances num_computed_tokens by the tokens scheduled; update_from_output
# takes a sampled token for each request whose computed tokens reached its tokens (a partial prefill samples
# none), stops it at max_tokens and frees it (_free_request adds its id to finished_req_ids, which the next
# SchedulerOutput carries); finish_requests aborts.

SCHEDULER_COMMIT = VLLM_COMMIT


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self):
        return self.name

    @staticmethod
    def is_finished(status):
        return status > RequestStatus.PREEMPTED


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list
    scheduled_cached_reqs: object
    num_scheduled_tokens: dict
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict
    scheduled_encoder_inputs: dict
    num_common_prefix_blocks: list
    finished_req_ids: set
    free_encoder_mm_hashes: list
    scheduled_encoder_input_stats: object = None
    preempted_req_ids: set = None
    has_structured_output_requests: bool = False
    pending_structured_output_tokens: bool = False
    num_invalid_spec_tokens: dict = None
    kv_connector_metadata: object = None
    ec_connector_metadata: object = None
    ec_manager_metadata: object = None
    new_block_ids_to_zero: list = None
    kv_cache_block_copies: list = None
    partial_tail_offloads: dict = None
    num_spec_tokens_to_schedule: int = 0


@dataclass
class ModelRunnerOutput:
    """vllm/v1/outputs.py: the fields update_from_output reads here."""
    req_ids: list
    req_id_to_index: dict
    sampled_token_ids: list


def scheduler_module():
    """A fresh module of the scheduler's classes (the plugin patches the classes it is given)."""

    class Request:
        def __init__(self, request_id, prompt_token_ids, max_tokens, arrival_time=0.0, client_index=0):
            self.request_id = request_id
            self.client_index = client_index
            self.arrival_time = arrival_time
            self.status = RequestStatus.WAITING
            self.max_tokens = max_tokens
            self.prompt_token_ids = prompt_token_ids
            self.num_prompt_tokens = len(prompt_token_ids)
            self._output_token_ids = []
            self._all_token_ids = list(prompt_token_ids)
            self.num_output_placeholders = 0
            self.num_computed_tokens = 0
            self.num_in_flight_tokens = 0
            self.is_prefill_chunk = False
            self.num_preemptions = 0

        @property
        def num_tokens(self):
            return len(self._all_token_ids)

        @property
        def num_output_tokens(self):
            return len(self._output_token_ids)

        def append_output_token_ids(self, token_ids):
            self._output_token_ids.extend(token_ids)
            self._all_token_ids.extend(token_ids)

        def is_finished(self):
            return RequestStatus.is_finished(self.status)

    class Scheduler:
        def __init__(self, *, max_num_seqs=256, max_num_batched_tokens=2048, num_kv_tokens=1 << 30,
                     include_finished_set=False, log_stats=False):
            self.max_num_running_reqs = max_num_seqs
            self.max_num_scheduled_tokens = max_num_batched_tokens
            self.num_kv_tokens = num_kv_tokens
            self.requests = {}
            self.waiting = deque()
            self.running = []
            self.finished_req_ids = set()
            self.reset_preempted_req_ids = set()
            self._kv = {}  # request id -> KV tokens allocated (the KV cache manager's blocks, as tokens)
            self._kv_used = 0

        def add_request(self, request):
            self.waiting.append(request)
            self.requests[request.request_id] = request

        def _allocate(self, request, num_new_tokens):
            need = request.num_computed_tokens + num_new_tokens - self._kv.get(request.request_id, 0)
            if self._kv_used + max(need, 0) > self.num_kv_tokens:
                return False
            self._kv[request.request_id] = request.num_computed_tokens + num_new_tokens
            self._kv_used += need
            return True

        def _release(self, request):
            self._kv_used -= self._kv.pop(request.request_id, 0)

        def schedule(self, throttle_prefills=False):
            token_budget = self.max_num_scheduled_tokens
            num_scheduled_tokens = {}
            preempted_reqs = []
            req_index = 0
            while req_index < len(self.running) and token_budget > 0:
                request = self.running[req_index]
                num_new_tokens = min(request.num_tokens + request.num_output_placeholders
                                     - request.num_computed_tokens, token_budget)
                if num_new_tokens <= 0:
                    req_index += 1
                    continue
                while not self._allocate(request, num_new_tokens):
                    preempted_req = self.running.pop()  # the lowest priority: the last in (FCFS)
                    self._preempt_request(preempted_req)
                    preempted_reqs.append(preempted_req)
                    if preempted_req is request:
                        break
                else:
                    num_scheduled_tokens[request.request_id] = num_new_tokens
                    token_budget -= num_new_tokens
                    req_index += 1
                    continue
                break
            if not preempted_reqs:
                while self.waiting and token_budget > 0 and len(self.running) < self.max_num_running_reqs:
                    request = self.waiting[0]
                    num_new_tokens = min(request.num_tokens - request.num_computed_tokens, token_budget)
                    if not self._allocate(request, num_new_tokens):
                        break
                    self.waiting.popleft()
                    self.running.append(request)
                    request.status = RequestStatus.RUNNING
                    num_scheduled_tokens[request.request_id] = num_new_tokens
                    token_budget -= num_new_tokens
            scheduler_output = SchedulerOutput(
                scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens=num_scheduled_tokens,
                total_num_scheduled_tokens=sum(num_scheduled_tokens.values()), scheduled_spec_decode_tokens={},
                scheduled_encoder_inputs={}, num_common_prefix_blocks=[], finished_req_ids=self.finished_req_ids,
                free_encoder_mm_hashes=[], preempted_req_ids={r.request_id for r in preempted_reqs})
            self._update_after_schedule(scheduler_output)
            return scheduler_output

        def _preempt_request(self, request, timestamp=0.0, drop_stale_output=False):
            self._release(request)
            request.status = RequestStatus.PREEMPTED
            request.num_computed_tokens = 0
            request.num_preemptions += 1
            self.waiting.appendleft(request)
            self.reset_preempted_req_ids.add(request.request_id)

        def _update_after_schedule(self, scheduler_output):
            for req_id, num_scheduled_token in scheduler_output.num_scheduled_tokens.items():
                request = self.requests[req_id]
                request.num_computed_tokens += num_scheduled_token
                request.is_prefill_chunk = request.num_computed_tokens < (
                    request.num_tokens + request.num_output_placeholders)
            self.finished_req_ids = set()
            self.reset_preempted_req_ids = set()

        def update_from_output(self, scheduler_output, model_runner_output):
            outputs = defaultdict(list)
            stopped = set()
            for req_id, num_tokens_scheduled in scheduler_output.num_scheduled_tokens.items():
                request = self.requests.get(req_id)
                if request is None or request.is_finished():
                    continue
                generated = model_runner_output.sampled_token_ids[model_runner_output.req_id_to_index[req_id]]
                if not generated:
                    continue  # a partial prefill
                request.append_output_token_ids(generated)
                finish_reason = None
                if request.num_output_tokens >= request.max_tokens:
                    request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    finish_reason = FinishReason.LENGTH
                    self._free_request(request)
                    stopped.add(request)
                outputs[request.client_index].append(
                    EngineCoreOutput(request_id=req_id, new_token_ids=list(generated), finish_reason=finish_reason))
            if stopped:
                self.running = [r for r in self.running if r not in stopped]
            return dict(outputs)

        def finish_requests(self, request_ids, finished_status):
            assert RequestStatus.is_finished(finished_status)
            if isinstance(request_ids, str):
                request_ids = (request_ids,)
            elif request_ids is not None:
                request_ids = set(request_ids)
            else:
                request_ids = list(self.requests.keys())
            valid_requests = []
            for req_id in request_ids:
                request = self.requests.get(req_id)
                if request is None or request.is_finished():
                    continue
                valid_requests.append(request)
                if request.status == RequestStatus.RUNNING:
                    self.running.remove(request)
                else:
                    self.waiting.remove(request)
            for request in valid_requests:
                request.status = finished_status
                self._free_request(request)
            return valid_requests

        def _free_request(self, request, delay_free_blocks=False):
            assert request.is_finished()
            self.finished_req_ids.add(request.request_id)
            self._release(request)
            del self.requests[request.request_id]
            return None, None

        def has_requests(self):
            return bool(self.waiting or self.running or self.finished_req_ids)

    mod = types.ModuleType("vllm.v1.core.sched.scheduler")
    for name, obj in (("Scheduler", Scheduler), ("Request", Request), ("RequestStatus", RequestStatus),
                      ("SchedulerOutput", SchedulerOutput)):
        setattr(mod, name, obj)
    return mod


# vllm/v1/engine/core.py: EngineCore.__init__ loads the general plugins ("plugins need to be loaded at the
# engine/scheduler level too"), then step() schedules, executes and closes each step with update_from_output.
# Its source is compiled in a module of vLLM's name, as the plugin tells the engine core's process by it.
_ENGINE_CORE_SOURCE = '''
class EngineCore:
    def __init__(self, scheduler, execute_model):
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        self.scheduler = scheduler
        self.execute_model = execute_model

    def step(self):
        if not self.scheduler.has_requests():
            return {}, False
        scheduler_output = self.scheduler.schedule(False)
        model_output = self.execute_model(scheduler_output)
        engine_core_outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        return engine_core_outputs, scheduler_output.total_num_scheduled_tokens > 0

    def abort_requests(self, request_ids):
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
'''


def engine_core_module():
    mod = types.ModuleType("vllm.v1.engine.core")
    mod.RequestStatus = RequestStatus
    exec(compile(_ENGINE_CORE_SOURCE, "vllm/v1/engine/core.py", "exec"), mod.__dict__)
    return mod


class ModelRunner:
    """Executes a step on a simulated clock: it advances ``clock.now`` by ``cost(tokens)`` ns and records the step
    (its time and each request's tokens), the truth the plugin's shares are held to."""

    def __init__(self, clock, cost):
        self.clock, self.cost, self.steps = clock, cost, []

    def __call__(self, scheduler_output, scheduler=None):
        tokens = dict(scheduler_output.num_scheduled_tokens)
        dt = self.cost(sum(tokens.values()))
        self.clock.now += dt
        self.steps.append((dt, tokens))
        ids = list(tokens)
        sampled = []
        for rid in ids:
            req = scheduler.requests.get(rid) if scheduler is not None else None
            done = req is None or req.num_computed_tokens >= req.num_tokens
            sampled.append([7] if done else [])
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                 sampled_token_ids=sampled)


class SimClock:
    def __init__(self, now=1_000_000):
        self.now = now

    def __call__(self):
        return self.now


# ---- drivers: what AsyncLLM and LLMEngine do around the output processor ----


def request(rid, kind=RequestOutputKind.DELTA, *, prompt=12, n=1, headers=None, external=None, session_id=None,
            resumable=False, stream_interval=None):
    """An EngineCoreRequest as InputProcessor makes it: the internal id is the external one and 8 hex digits."""
    external = external or "chatcmpl-" + rid
    return EngineCoreRequest(request_id="%s-%08x" % (external, hash(rid) & 0xFFFFFFFF),
                             prompt_token_ids=list(range(prompt)),
                             sampling_params=SamplingParams(n=n, output_kind=kind, stream_interval=stream_interval),
                             arrival_time=time.time(), trace_headers=headers, external_req_id=external,
                             session_id=session_id, resumable=resumable)


def add(proc, req, *, queue=True):
    """AsyncLLM.add_request (queue=True) or LLMEngine.add_request (queue=False): the request, or its n children
    (ids ``<index>_<parent id>``) under a ParentRequest. Returns the internal ids added."""
    q = RequestOutputCollector(req.sampling_params.output_kind, req.request_id) if queue else None
    if req.sampling_params.n == 1:
        proc.add_request(req, None, None, 0, q)
        return [req.request_id]
    parent = ParentRequest(req)
    ids = []
    for idx in range(req.sampling_params.n):
        child_id, params = parent.get_child_info(idx)
        child = copy(req)
        child.request_id, child.sampling_params = child_id, params
        proc.add_request(child, None, parent, idx, q)
        ids.append(child_id)
    return ids


def step(proc, outputs):
    """One engine step: EngineCoreOutputs, given as (internal id, new token ids, finish reason or None)."""
    return proc.process_outputs([EngineCoreOutput(request_id=rid, new_token_ids=list(new), finish_reason=fr)
                                 for rid, new, fr in outputs])
