"""Tests of otelcol_llm_vllm_steps, the engine core's half of the vLLM plugin: `python3 -m unittest -v`.

They drive the stand-in of vLLM's scheduler and engine core (vllm_standin.py, shaped as vLLM's at the commit named
there) on a simulated clock, so the truth is known exactly:

- ShareTest: each request's share against shares worked out by hand (chunked prefill; a pre-emption whose
  recomputation is paid again), against a truth computed apart from the plugin from every step a simulated model
  runner executed (many requests, pre-emptions, aborts), and overlapping steps (vLLM's batch queue) counted once;
- EngineCoreTotalityTest: loaded as vLLM loads it (EngineCore.__init__ calls load_general_plugins, which calls the
  entry point without a try), only in the engine core, and total against a scheduler changed under it.
"""

import functools
import importlib
import os
import random
import shutil
import sys
import tempfile
import unittest
from unittest import mock

import otelcol_llm_vllm as plugin
import otelcol_llm_vllm_steps as steps
import vllm_standin as vllm
from test_otelcol_llm_vllm import Recorder, reset_plugin


def ns_per_token(n):
    return 100 * n


class Engine:
    """A stand-in engine core with a ledger installed on its scheduler, on a simulated clock."""

    def __init__(self, client, *, cost=ns_per_token, install=True, **sched):
        self.clock = vllm.SimClock()
        self.mod = vllm.scheduler_module()
        self.ledger = steps.StepLedger(client, engine="vllm-0", clock=self.clock)
        if install:
            assert steps.install(self.mod, self.ledger)
            assert not steps.install(self.mod, self.ledger), "idempotent"
        self.sched = self.mod.Scheduler(**sched)
        self.runner = vllm.ModelRunner(self.clock, cost)
        self.preempted = []

    def add(self, rid, prompt, max_tokens):
        self.sched.add_request(self.mod.Request(rid, list(range(prompt)), max_tokens))

    def step(self):
        so = self.sched.schedule(False)
        self.preempted.append(set(so.preempted_req_ids or ()))
        out = self.runner(so, self.sched)
        return self.sched.update_from_output(so, out)

    def run(self, limit=10_000):
        n = 0
        while self.sched.has_requests() and n < limit:
            self.step()
            n += 1
        return n


def shares(client):
    return {e["engine_request_id"]: (e["engine_time_prefill_ns"], e["engine_time_decode_ns"])
            for e in client.events if e["event"] == "share"}


class ShareTest(unittest.TestCase):
    def setUp(self):
        self.client = Recorder()

    def tearDown(self):
        self.client.close()

    def test_chunked_prefill_by_hand(self):
        # 8 tokens a step, 100 ns a token. Step 1: A's first 8 prompt tokens (800 ns). Step 2: A's last 2 and B's
        # 4 (600 ns: 200 to A, 400 to B); both sample, B is done. Step 3: A decodes 1 (100 ns) and is done.
        e = Engine(self.client, max_num_batched_tokens=8)
        e.add("A", 10, 2)
        e.add("B", 4, 1)
        e.run()
        self.assertEqual(shares(self.client), {"A": (1000, 100), "B": (400, 0)})
        self.assertEqual(e.ledger.busy_ns, 1500)
        self.assertEqual(e.ledger.in_flight(), 0, "nothing left behind")
        share = [ev for ev in self.client.events if ev["event"] == "share"][0]
        self.assertEqual(share["engine"], "vllm-0")

    def test_preemption_recompute_by_hand(self):
        # 16 tokens a step, KV for 20 tokens, 100 ns a token. Step 1: both prompts (8 + 8). Steps 2-3: a decode
        # each. Step 4: A's 11th token does not fit: B, the last in, is pre-empted (its 10 tokens freed, its
        # computed tokens reset to 0); A decodes alone in steps 4-6 while B waits. Step 7: B computes its 8 prompt
        # tokens and its 3 generated ones again (1100 ns: 800 prefill, 300 decode), then decodes in steps 8-9.
        e = Engine(self.client, max_num_batched_tokens=16, num_kv_tokens=20)
        e.add("A", 8, 6)
        e.add("B", 8, 6)
        e.run()
        self.assertEqual(e.preempted[3], {"B"})
        self.assertEqual(shares(self.client), {"A": (800, 500), "B": (1600, 700)})
        self.assertEqual(e.ledger.busy_ns, 3600)

    def test_many_requests_against_the_steps_executed(self):
        rng = random.Random(42)
        e = Engine(self.client, cost=lambda n: 5_000_000 + 40_000 * n + rng.randrange(1000) if n else 0,
                   max_num_batched_tokens=512, num_kv_tokens=6000, max_num_seqs=64)
        prompts, added, aborted = {}, 0, set()
        for i in range(2000):
            if added < 300 and rng.random() < 0.5:
                rid = "r%d" % added
                prompts[rid] = rng.randrange(1, 900)
                e.add(rid, prompts[rid], rng.randrange(1, 120))
                added += 1
            if e.sched.running and rng.random() < 0.01:
                victim = rng.choice(e.sched.running).request_id
                e.sched.finish_requests([victim], vllm.RequestStatus.FINISHED_ABORTED)
                aborted.add(victim)
            if e.sched.has_requests():
                e.step()
        e.run()
        self.assertGreater(sum(len(p) for p in e.preempted), 10, "the load pre-empts")
        self.assertTrue(aborted)
        # The truth, apart from the plugin: every step executed, split by tokens, prefill while a request's
        # computed tokens (reset by its pre-emptions) are below its prompt.
        truth, computed = {}, {}
        for (dt, tokens), preempted in zip(e.runner.steps, e.preempted):
            for rid in preempted:
                computed[rid] = 0
            total = sum(tokens.values())
            for rid, n in tokens.items():
                before = computed.get(rid, 0)
                p = min(max(prompts[rid] - before, 0), n)
                t = truth.setdefault(rid, [0.0, 0.0])
                t[0] += dt * p / total
                t[1] += dt * (n - p) / total
                computed[rid] = before + n
        got = shares(self.client)
        self.assertEqual(set(got), set(truth), "a share for every request that was computed, aborted or not")
        for rid, (p, d) in truth.items():
            gp, gd = got[rid]
            self.assertLessEqual(abs(gp - p), max(1.0, 0.01 * p), rid)
            self.assertLessEqual(abs(gd - d), max(1.0, 0.01 * d), rid)
        busy = sum(dt for dt, _ in e.runner.steps)
        self.assertEqual(e.ledger.busy_ns, busy)
        self.assertLessEqual(abs(sum(p + d for p, d in got.values()) - busy), len(got), "the shares add up")
        self.assertEqual(e.ledger.in_flight(), 0)

    def test_overlapping_steps_count_each_instant_once(self):
        # vLLM's batch queue: step 2 is scheduled (at 50) while step 1 runs; step 1 closes at 100, step 2 at 180.
        e = Engine(self.client, install=False)
        ledger, mod = e.ledger, e.mod
        sched = mod.Scheduler(max_num_batched_tokens=4)
        sched.add_request(mod.Request("A", [1, 2], 2))
        sched.add_request(mod.Request("B", [1, 2], 1))
        so1 = sched.schedule()
        ledger.scheduled(sched, so1, 0)
        so2 = mod.SchedulerOutput([], None, {"A": 1}, 1, {}, {}, [], set(), [])
        sched.requests["A"].num_computed_tokens += 1
        ledger.scheduled(sched, so2, 50)
        ledger.closed(so1, 100)
        ledger.closed(so2, 180)
        ledger.scheduled(sched, mod.SchedulerOutput([], None, {}, 0, {}, {}, [], {"A", "B"}, []), 200)
        self.assertEqual(shares(self.client), {"A": (50, 80), "B": (50, 0)})
        self.assertEqual(ledger.busy_ns, 180)

    def test_share_waits_for_the_steps_that_computed_for_it(self):
        # Async scheduling: a request freed while a later step that computed for it is still open gets that
        # step's time too, when it closes.
        e = Engine(self.client, install=False)
        ledger, mod = e.ledger, e.mod
        sched = mod.Scheduler()
        sched.add_request(mod.Request("A", [1], 5))
        so1 = sched.schedule()
        ledger.scheduled(sched, so1, 0)
        so2 = mod.SchedulerOutput([], None, {"A": 1}, 1, {}, {}, [], set(), [])
        sched.requests["A"].num_computed_tokens += 1
        ledger.scheduled(sched, so2, 10)
        ledger.closed(so1, 100)
        ledger.scheduled(sched, mod.SchedulerOutput([], None, {}, 0, {}, {}, [], {"A"}, []), 110)
        self.assertEqual(shares(self.client), {}, "step 2 still open")
        ledger.closed(so2, 150)
        self.assertEqual(shares(self.client), {"A": (100, 50)})

    def test_bounds(self):
        e = Engine(self.client, install=False)
        e.ledger.max_requests, e.ledger.max_open_steps = 2, 2
        mod, ledger = e.mod, e.ledger
        sched = mod.Scheduler()
        for rid in "ABC":
            sched.add_request(mod.Request(rid, [1], 1))
        so = sched.schedule()
        ledger.scheduled(sched, so, 0)
        ledger.closed(so, 300)
        self.assertEqual(ledger.untracked, 1)
        self.assertEqual(ledger.stats()["unattributed_ns"], 100, "the untracked request's part is counted")
        outs = [mod.SchedulerOutput([], None, {}, 0, {}, {}, [], set(), []) for _ in range(3)]
        for i, o in enumerate(outs):
            ledger.scheduled(sched, o, 400 + i)
        self.assertEqual(ledger.steps_given_up, 1)
        ledger.closed(outs[0], 500)
        self.assertEqual(ledger.steps_unmatched, 1)


class ShareEventTest(unittest.TestCase):
    def test_share_line(self):
        client = Recorder()
        self.addCleanup(client.close)
        client.share("chatcmpl-x-0badcafe", 5, engine="vllm-0", engine_time_prefill_ns=7, engine_time_decode_ns=9)
        self.assertEqual(client.events, [{"event": "share", "engine_request_id": "chatcmpl-x-0badcafe",
                                          "time_unix_nano": 5, "engine": "vllm-0", "engine_time_prefill_ns": 7,
                                          "engine_time_decode_ns": 9}])
        for bad in (dict(engine_request_id=""), dict(engine_request_id="x" * 257),
                    dict(engine_request_id="x", engine_time_decode_ns=-1)):
            with self.assertRaises(ValueError):
                client.share(**bad)
        self.assertEqual(len(client.events), 1, "nothing sent for a bad call")


class StartNamesTheEngineRequestTest(unittest.TestCase):
    def test_start_carries_the_internal_id_the_share_carries(self):
        # The API server's half names vLLM's internal request id on the start: the id the engine core sees (its
        # Request has no external id), which the collector joins the share by.
        client = Recorder()
        self.addCleanup(client.close)
        observer = plugin.Observer(client, engine="vllm-0", engine_request_ids=True)
        mod = vllm.output_processor_module()
        self.assertTrue(plugin.install(mod, observer))
        proc = mod.OutputProcessor(None, log_stats=False)
        (rid,) = vllm.add(proc, vllm.request("x", session_id="conv-1"))
        start = client.events[0]
        self.assertEqual(start["session_id"], "chatcmpl-x")
        self.assertNotEqual(rid, "chatcmpl-x")
        self.assertEqual(start["attributes"], {plugin.ENGINE_REQUEST_ID_ATTRIBUTE: rid,
                                               plugin.CONVERSATION_ATTRIBUTE: "conv-1"})


class EngineCoreTotalityTest(unittest.TestCase):
    """Loaded through vLLM's plugin loader from EngineCore.__init__, the engine core's half never harms vLLM."""

    def setUp(self):
        reset_plugin()
        plugin._ledger = None
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
        env = mock.patch.dict(os.environ, {plugin.ENV_ENDPOINT: "udp://127.0.0.1:9", plugin.ENV_ENGINE_SHARE: "1"})
        env.start()
        self.addCleanup(env.stop)
        os.environ.pop("VLLM_PLUGINS", None)
        made = mock.patch("otelcol_llm_hook.Client", side_effect=lambda _endpoint: self.client)
        made.start()
        self.addCleanup(made.stop)

    def tearDown(self):
        sys.path.remove(self.tmp)
        shutil.rmtree(self.tmp)
        self.client.close()
        reset_plugin()
        plugin._ledger = None

    def drive(self, sched_mod, *, in_core=True, share=True):
        """A fixed load through the engine core: what vLLM's calls returned, for comparison (share=False: with
        the plugin's engine shares off, as vLLM without the plugin)."""
        clock = vllm.SimClock()
        runner = vllm.ModelRunner(clock, ns_per_token)
        core = vllm.engine_core_module()
        sched = sched_mod.Scheduler(max_num_batched_tokens=16, num_kv_tokens=20)
        with mock.patch.dict(sys.modules, vllm.vllm_modules(scheduler=sched_mod, engine_core=core)), \
                mock.patch.dict(os.environ, {plugin.ENV_ENGINE_SHARE: "1" if share else "0"}):
            if in_core:
                engine = core.EngineCore(sched, functools.partial(_execute, runner, sched))
            else:
                vllm.load_general_plugins()
                engine = core.EngineCore.__new__(core.EngineCore)
                engine.scheduler, engine.execute_model = sched, functools.partial(_execute, runner, sched)
        for i, (prompt, max_tokens) in enumerate(((8, 6), (8, 6), (3, 2), (30, 4))):
            sched.add_request(sched_mod.Request("r%d" % i, list(range(prompt)), max_tokens))
        got = []
        for n in range(200):
            if not sched.has_requests():
                break
            if n == 2:
                engine.abort_requests(["r0", "r3"])
            out, executed = engine.step()
            got.append((sorted((k, [(o.request_id, o.new_token_ids, o.finish_reason) for o in v])
                               for k, v in out.items()), executed))
        return got

    def test_in_the_engine_core(self):
        mod, plain = vllm.scheduler_module(), vllm.scheduler_module()
        self.assertEqual(self.drive(mod), self.drive(plain, share=False))
        s = plugin.stats()
        self.assertTrue(s["steps_installed"], s)
        self.assertEqual(s["errors"], 0)
        # r0 aborted after it computed, r3 aborted while it waited: it never computed, so it has no share.
        self.assertEqual(set(shares(self.client)), {"r0", "r1", "r2"})
        self.assertEqual(s["engine_core"]["shares_sent"], 3)
        self.assertEqual(s["engine_core"]["shares_in_flight"], 0)

    def test_not_outside_the_engine_core(self):
        # The API server and the workers load the plugin too: the scheduler is not theirs.
        mod = vllm.scheduler_module()
        before = mod.Scheduler.schedule
        self.drive(mod, in_core=False)
        self.assertIs(mod.Scheduler.schedule, before)
        self.assertFalse(plugin.stats()["steps_installed"])

    def test_off_unless_asked(self):
        mod = vllm.scheduler_module()
        before = mod.Scheduler.schedule
        self.drive(mod, share=False)
        self.assertIs(mod.Scheduler.schedule, before)

    def test_changed_scheduler(self):
        for name, change, failure in CHANGES:
            with self.subTest(name):
                reset_plugin()
                plugin._ledger = None
                self.client.events.clear()
                mod, plain = vllm.scheduler_module(), vllm.scheduler_module()
                change(mod)
                change(plain)
                with self.assertLogs("vllm.plugins.otelcol_llm", "INFO") as logs:
                    got = self.drive(mod)  # must not raise
                self.assertEqual(got, self.drive(plain, share=False), "vLLM's calls return what the originals return")
                s = plugin.stats()
                self.assertGreater(s[failure], 0, s)
                self.assertTrue(any("WARNING" in line for line in logs.output), logs.output)

    def test_original_exceptions_pass_through_once(self):
        mod = vllm.scheduler_module()
        calls = []

        def update_from_output(self, scheduler_output, model_runner_output):
            calls.append(1)
            raise KeyError("vLLM's own failure")

        mod.Scheduler.update_from_output = update_from_output
        with self.assertRaises(KeyError) as e:
            self.drive(mod)
        self.assertEqual(e.exception.args, ("vLLM's own failure",))
        self.assertEqual(len(calls), 1)
        self.assertEqual(plugin.stats()["errors"], 0)

    def test_client_failing_everywhere(self):
        class Broken(Recorder):
            def _put(self, item):
                raise RuntimeError("boom")

        self.client.close()
        self.client = Broken()
        mod, plain = vllm.scheduler_module(), vllm.scheduler_module()
        with self.assertLogs("vllm.plugins.otelcol_llm", "WARNING") as logs:
            self.assertEqual(self.drive(mod), self.drive(plain, share=False))
        self.assertGreater(plugin.stats()["errors"], 0)
        self.assertEqual(len(logs.output), 1, "logged once")
        self.assertNotIn("boom", logs.output[0])


def _execute(runner, sched, scheduler_output):
    return runner(scheduler_output, sched)


def _rename_update_param(mod):
    def update_from_output(self, output, model_runner_output, _orig=mod.Scheduler.update_from_output):
        return _orig(self, output, model_runner_output)

    mod.Scheduler.update_from_output = update_from_output


def _schedule_gone(mod):
    # schedule() as a bound method made by a property: not a plain function the plugin can wrap.
    mod.Scheduler.plan = mod.Scheduler.schedule
    mod.Scheduler.schedule = property(lambda self: self.plan)


def _computed_renamed(mod):
    # Request.num_computed_tokens under another name: the plugin's reads fail, vLLM's do not.
    mod.Request.num_computed_tokens = property(_raise_attribute_error("num_computed_tokens"),
                                       lambda self, v: self.__dict__.__setitem__("computed", v))


def _raise_attribute_error(name):
    def get(self):
        import inspect
        caller = inspect.currentframe().f_back.f_globals.get("__name__")
        if caller == "otelcol_llm_vllm_steps":
            raise AttributeError(name)
        return self.__dict__["computed"]
    return get


def _output_field_renamed(mod):
    # SchedulerOutput.num_scheduled_tokens read by the plugin under a name vLLM no longer has.
    orig = mod.Scheduler.schedule

    def schedule(self, throttle_prefills=False):
        so = orig(self, throttle_prefills)
        return _Renamed(so)

    mod.Scheduler.schedule = schedule
    orig_update = mod.Scheduler.update_from_output
    mod.Scheduler.update_from_output = lambda self, scheduler_output, mro: orig_update(
        self, scheduler_output.inner, mro)


class _Renamed:
    def __init__(self, inner):
        self.inner = inner
        self.total_num_scheduled_tokens = inner.total_num_scheduled_tokens
        self.preempted_req_ids = inner.preempted_req_ids
        self.scheduled_tokens = inner.num_scheduled_tokens

    @property
    def num_scheduled_tokens(self):
        import inspect
        if inspect.currentframe().f_back.f_globals.get("__name__") == "otelcol_llm_vllm_steps":
            raise AttributeError("num_scheduled_tokens")
        return self.scheduled_tokens


CHANGES = (
    ("update_from_output's scheduler_output renamed", _rename_update_param, "refused"),
    ("schedule not a function", _schedule_gone, "refused"),
    ("Request.num_computed_tokens renamed", _computed_renamed, "errors"),
    ("SchedulerOutput.num_scheduled_tokens renamed", _output_field_renamed, "errors"),
)


if __name__ == "__main__":
    unittest.main()
