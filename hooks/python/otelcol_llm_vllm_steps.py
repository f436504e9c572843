"""otelcol-llm inside vLLM's engine core: each request's exact share of the engine's busy time, from its steps.

The engine-core half of the vLLM plugin (``otelcol_llm_vllm``): vLLM loads general plugins in every one of its
processes, the engine core's included (``vllm/v1/engine/core.py``: ``EngineCore.__init__`` calls
``load_general_plugins()``); ``register`` tells that process by its caller and installs this there. It wraps two
methods of vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``):

- ``Scheduler.schedule``: a step begins (the time is read before it); the ``SchedulerOutput`` it returns maps each
  request to the tokens scheduled for it in the step (``num_scheduled_tokens``: prefill chunks, decode, and after
  a pre-emption the recomputation of the prompt and of the tokens generated before it, since ``_preempt_request``
  resets ``num_computed_tokens`` to 0), and names the requests freed since the previous step
  (``finished_req_ids``: stopped in ``update_from_output`` or aborted by ``finish_requests``);
- ``Scheduler.update_from_output(scheduler_output, model_runner_output)``: the step's model output is in, the step
  is over (the time is read after it).

A step's time is split among its requests by the tokens each computed in it: the tokens while the request's
computed tokens were below its prompt are prefill, the rest decode. Steps that overlap (vLLM's batch queue, async
scheduling: the next step is scheduled while one runs) are counted from the end of the one before, so that the
steps' times add up to the engine's busy time, each instant once. A request's share goes out when it is freed and
no step that computed for it is still open, as a ``share`` event named by vLLM's internal request id, which the
API server's half of the plugin puts on the session's start (``llm.engine.request_id``): the collector joins the
two. Per step the work is plain arithmetic over the step's requests.

The same rules as the output processor's half: nothing raises into vLLM, nothing blocks it (the client queues and
drops, counted), a target not shaped as the plugin knows it is refused and left alone, the shares are kept in the
plugin's own table, never on vLLM's objects, and the table is bounded.
"""

import functools
import logging
import sys
import time

import otelcol_llm_vllm_patching as patching

__all__ = ["StepLedger", "install", "in_engine_core", "TARGETS", "ENGINE_CORE_MODULE"]

_log = logging.getLogger("vllm.plugins.otelcol_llm")

# The module whose EngineCore.__init__ loads the general plugins in the engine core's process.
ENGINE_CORE_MODULE = "vllm.v1.engine.core"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"

# What the plugin patches in vllm.v1.core.sched.scheduler; both or neither (a step opened and never closed, or
# closed and never opened, would be no share at all).
TARGETS = (
    patching.Target("Scheduler", "schedule", [], essential=True),
    patching.Target("Scheduler", "update_from_output", ["scheduler_output"], essential=True),
)

# Requests whose share is being counted, at most (vLLM's max_num_seqs is 256 by default, 1024 at most in
# practice; waiting requests that were scheduled once and pre-empted count too). Beyond it a request gets no share
# (counted in "untracked").
MAX_REQUESTS = 65536
# Steps scheduled and not yet closed, at most: vLLM keeps max_concurrent_batches of them (1, 2 with async
# scheduling, the pipeline depth with pipeline parallelism). Beyond it the oldest is given up (counted).
MAX_OPEN_STEPS = 64


class _Share:
    """One request's share so far: ns of prefill and decode, the open steps that computed for it, and whether vLLM
    freed it."""

    __slots__ = ("request_id", "prefill", "decode", "prefill_tokens", "decode_tokens", "open", "finished")

    def __init__(self, request_id):
        self.request_id = request_id
        self.prefill = self.decode = 0.0
        self.prefill_tokens = self.decode_tokens = 0
        self.open = 0
        self.finished = False


class StepLedger:
    """Splits each scheduler step's time among its requests, and sends each request's share when it is done.

    ``scheduled`` and ``closed`` take vLLM's own objects (a Scheduler and the SchedulerOutput of a step); they are
    called by the wrappers ``install`` puts on vLLM's scheduler, or directly. ``clock`` gives monotonic ns.
    """

    def __init__(self, client, *, engine=None, clock=time.perf_counter_ns, max_requests=MAX_REQUESTS,
                 max_open_steps=MAX_OPEN_STEPS):
        # client is a Client or a function that makes one (with the first share, in the engine core only).
        self._client = client
        self.engine = engine
        self.clock = clock
        self.max_requests, self.max_open_steps = max_requests, max_open_steps
        self._shares = {}
        # The steps scheduled and not closed, by the id of their SchedulerOutput (held, so the id stays its own).
        self._open = {}
        self._last_close = 0
        self.errors = 0
        self._warned = False
        # What the ledger counts: steps closed, the engine's busy time (ns) over them, the part of it no request
        # was charged for (a step with no tokens, a request beyond max_requests), shares sent, requests not tracked,
        # steps given up (never closed) or closed without their schedule.
        self.steps = 0
        self.busy_ns = 0
        self.unattributed_ns = 0.0
        self.sent = 0
        self.untracked = 0
        self.steps_given_up = 0
        self.steps_unmatched = 0

    @property
    def client(self):
        c = self._client
        if callable(c) and not hasattr(c, "share"):
            c = self._client = c()
        return c

    def has_client(self):
        return not (callable(self._client) and not hasattr(self._client, "share"))

    def in_flight(self):
        """How many requests have a share being counted."""
        return len(self._shares)

    def failed(self, where, exc):
        self.errors += 1
        if not self._warned:
            self._warned = True
            _log.warning("otelcol-llm vLLM plugin (engine core): %s failed (%s); vLLM goes on, shares may be "
                         "missing (further failures are counted, not logged)", where, type(exc).__name__)

    # -- the points the wrappers call ----------------------------------------

    def scheduled(self, scheduler, scheduler_output, start):
        """``Scheduler.schedule`` returned ``scheduler_output``; it was called at ``start`` (clock ns)."""
        tokens = scheduler_output.num_scheduled_tokens
        requests = scheduler.requests
        shares = self._shares
        entries = []
        total = 0
        for rid, n in tokens.items():
            total += n
            sh = shares.get(rid)
            if sh is None:
                if len(shares) >= self.max_requests:
                    self.untracked += 1
                    continue
                sh = shares[rid] = _Share(rid)
            # schedule() has advanced num_computed_tokens by the n tokens of this step already.
            req = requests[rid]
            prefill = req.num_prompt_tokens - (req.num_computed_tokens - n)
            prefill = 0 if prefill <= 0 else (n if prefill >= n else prefill)
            sh.open += 1
            entries.append((sh, n, prefill))
        if len(self._open) >= self.max_open_steps:
            self._give_up(next(iter(self._open)))
        self._open[id(scheduler_output)] = (scheduler_output, start, entries, total)
        for rid in scheduler_output.finished_req_ids:
            sh = shares.get(rid)
            if sh is not None:
                sh.finished = True
                if sh.open == 0:
                    self._send(sh)

    def closed(self, scheduler_output, end):
        """``Scheduler.update_from_output(scheduler_output, …)`` returned at ``end`` (clock ns)."""
        step = self._open.pop(id(scheduler_output), None)
        if step is None or step[0] is not scheduler_output:
            self.steps_unmatched += 1
            return
        _, start, entries, total = step
        begin = start if start > self._last_close else self._last_close
        dt = end - begin if end > begin else 0
        if end > self._last_close:
            self._last_close = end
        self.steps += 1
        self.busy_ns += dt
        if total <= 0:
            self.unattributed_ns += dt
            for sh, _, _ in entries:
                self._leave(sh)
            return
        per = dt / total
        given = 0
        for sh, n, prefill in entries:
            if prefill:
                sh.prefill += prefill * per
                sh.prefill_tokens += prefill
            if n > prefill:
                sh.decode += (n - prefill) * per
                sh.decode_tokens += n - prefill
            given += n
            sh.open -= 1
            if sh.finished and sh.open == 0:
                self._send(sh)
        if given < total:
            self.unattributed_ns += (total - given) * per

    # -- helpers -----------------------------------------------------------

    def _leave(self, sh):
        sh.open -= 1
        if sh.finished and sh.open == 0:
            self._send(sh)

    def _give_up(self, key):
        _, _, entries, _ = self._open.pop(key)
        self.steps_given_up += 1
        for sh, _, _ in entries:
            self._leave(sh)

    def _send(self, sh):
        if self._shares.get(sh.request_id) is sh:
            del self._shares[sh.request_id]
        self.sent += 1
        self.client.share(sh.request_id, time.time_ns(), engine=self.engine,
                          engine_time_prefill_ns=int(sh.prefill + 0.5), engine_time_decode_ns=int(sh.decode + 0.5))

    def stats(self):
        return {"steps": self.steps, "busy_ns": self.busy_ns, "unattributed_ns": int(self.unattributed_ns),
                "shares_sent": self.sent, "shares_in_flight": len(self._shares), "untracked": self.untracked,
                "steps_given_up": self.steps_given_up, "steps_unmatched": self.steps_unmatched,
                "errors": self.errors}


def in_engine_core(depth=64):
    """Whether the caller runs under vLLM's ``EngineCore.__init__``: the engine core loads the general plugins
    there, and no other process of vLLM's does."""
    try:
        f = sys._getframe(1)
    except (AttributeError, ValueError):
        return False
    while f is not None and depth > 0:
        if f.f_code.co_name == "__init__" and f.f_globals.get("__name__") == ENGINE_CORE_MODULE:
            return True
        f = f.f_back
        depth -= 1
    return False


def install(scheduler_module, ledger):
    """Wrap the ``TARGETS`` of vLLM's ``vllm.v1.core.sched.scheduler`` module so that they tell ``ledger``.

    Returns True when it patched, False when it did not (already patched, or refused). Never raises."""
    try:
        return _install(scheduler_module, ledger)
    except Exception as e:
        patching.counters.register_errors += 1
        patching.say_once("install-steps", logging.WARNING, "otelcol-llm vLLM plugin: install in the engine core "
                          "failed (%s); vLLM runs unchanged", type(e).__name__)
        return False


def _install(module, ledger):
    checked = []
    for t in TARGETS:
        cls = getattr(module, t.cls, None)
        ok, why = patching.check(cls, t)
        if ok is None:
            patching.refuse(t, why)
            patching.say_once("off-steps", logging.WARNING,
                              "otelcol-llm vLLM plugin: no engine shares: this vLLM's scheduler is not shaped as the "
                              "plugin knows it; see hooks/python/README.md for the versions checked")
            return False
        func, where = ok
        if getattr(func, patching.MARK, False):
            return False
        checked.append((cls, t, func, where))
    (cls, _, schedule, _), (_, _, update, where) = checked
    clock = ledger.clock

    @functools.wraps(schedule)
    def wrapped_schedule(*args, **kwargs):
        try:
            start = clock()
        except Exception as e:
            start = None
            _failed(ledger, "schedule", e)
        result = schedule(*args, **kwargs)
        if start is not None:
            try:
                ledger.scheduled(args[0], result, start)
            except Exception as e:
                _failed(ledger, "schedule", e)
        return result

    @functools.wraps(update)
    def wrapped_update(*args, **kwargs):
        result = update(*args, **kwargs)
        try:
            ledger.closed(patching.arg(where, args, kwargs, "scheduler_output"), clock())
        except Exception as e:
            _failed(ledger, "update_from_output", e)
        return result

    for w in (wrapped_schedule, wrapped_update):
        setattr(w, patching.MARK, True)
    cls.schedule = wrapped_schedule
    cls.update_from_output = wrapped_update
    patching.counters.steps_installed = True
    return True


def _failed(ledger, where, exc):
    try:
        ledger.failed(where, exc)
    except Exception:
        pass
