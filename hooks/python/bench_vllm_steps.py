"""What the engine core's half of the vLLM plugin costs per scheduler step: `python3 bench_vllm_steps.py`.

It drives the stand-in of vLLM's scheduler (vllm_standin.py, shaped as vLLM's at the commit named there) with 256
running requests decoding (one token each a step) and 1 in 8 steps carrying a 512-token prefill chunk of a new
request, once plain and once with the plugin's wrappers on Scheduler.schedule and update_from_output, sending each
finished request's share to a UDP socket on loopback. The figure is the difference per step between the best of 5
runs of each, alternated: the time the plugin adds to vLLM's busy loop. The budget: at most 1% of a step; a decode
step of 256 requests takes vLLM tens of milliseconds on a GPU (the stand-in's step, with no model, far less).
"""

import socket
import time

import otelcol_llm_vllm_steps as steps
import vllm_standin as vllm
from otelcol_llm_hook import Client

RUNNING, STEPS, RUNS = 256, 400, 5


def drive(mod):
    sched = mod.Scheduler(max_num_seqs=RUNNING + 1, max_num_batched_tokens=RUNNING + 512)
    n = 0
    for _ in range(RUNNING):
        sched.add_request(mod.Request("r%d" % n, list(range(64)), 1 << 30))
        n += 1
    clock = vllm.SimClock()
    runner = vllm.ModelRunner(clock, lambda t: t)
    for _ in range(3):  # the prompts in, then decode
        sched.update_from_output(*(lambda so: (so, runner(so, sched)))(sched.schedule()))
    start = time.perf_counter()
    for s in range(STEPS):
        if s % 8 == 0:
            sched.add_request(mod.Request("p%d" % s, list(range(512)), 1))
        so = sched.schedule()
        sched.update_from_output(so, runner(so, sched))
        runner.steps.clear()
    return time.perf_counter() - start


def ledger_alone():
    """The ledger's work for one step of RUNNING decoding requests, without vLLM around it: the best per step."""
    mod = vllm.scheduler_module()
    sched = mod.Scheduler()

    class Null:
        def share(self, *a, **kw):
            pass

    ledger = steps.StepLedger(Null())
    for i in range(RUNNING):
        req = mod.Request("r%d" % i, list(range(64)), 1 << 30)
        req.num_computed_tokens = 100
        sched.requests[req.request_id] = req
    so = mod.SchedulerOutput([], None, {rid: 1 for rid in sched.requests}, RUNNING, {}, {}, [], set(), [])
    clock = time.perf_counter_ns
    start = time.perf_counter()
    for _ in range(STEPS):
        ledger.scheduled(sched, so, clock())
        ledger.closed(so, clock())
    return (time.perf_counter() - start) / STEPS


def main():
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    client = Client("udp://127.0.0.1:%d" % sink.getsockname()[1])
    plain, hooked = vllm.scheduler_module(), vllm.scheduler_module()
    ledger = steps.StepLedger(client, engine="vllm-0")
    assert steps.install(hooked, ledger)
    runs = [(drive(plain), drive(hooked)) for _ in range(RUNS)]
    t_plain, t_hooked = min(p for p, _ in runs), min(h for _, h in runs)
    own = min(ledger_alone() for _ in range(RUNS))
    client.close()
    st = client.stats()
    sink.close()
    print("vLLM scheduler loop (stand-in at vLLM %s), %d running requests: %.1f us/step plain, %.1f us/step with "
          "the plugin: +%.1f us/step (%d steps, best of %d; shares sent %d, dropped %d; plugin errors %d)"
          % (vllm.SCHEDULER_COMMIT[:12], RUNNING, t_plain / STEPS * 1e6, t_hooked / STEPS * 1e6,
             (t_hooked - t_plain) / STEPS * 1e6, STEPS, RUNS, st["sent"], st["dropped"], ledger.errors))
    print("the plugin's own work alone (both wrappers' calls into the ledger, %d requests a step): %.1f us/step"
          % (RUNNING, own * 1e6))


if __name__ == "__main__":
    main()
