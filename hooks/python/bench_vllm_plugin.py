"""What the vLLM plugin costs per token in the engine's process: `python3 bench_vllm_plugin.py`.

It drives the stand-in of vLLM's output processor (vllm_standin.py, shaped as vLLM's at the commit named there)
through DELTA streams, 64 concurrent requests of 256 tokens, one token per request per step, as vLLM's API server
process sees them, once plain and once with the plugin installed, sending to a UDP socket on loopback. The figure
is the difference per token between the best of 5 runs of each, alternated: the time the wrappers add to vLLM's
loop (the client's sender thread runs beside it, and its share of the GIL is in the figure).
"""

import socket
import time

import otelcol_llm_vllm as plugin
import vllm_standin as vllm
from otelcol_llm_hook import Client

REQUESTS, TOKENS, RUNS = 64, 256, 5


def drive(mod):
    proc = mod.OutputProcessor(None, log_stats=True)
    ids = [i for n in range(REQUESTS) for i in vllm.add(proc, vllm.request("b%d" % n, vllm.RequestOutputKind.DELTA))]
    start = time.perf_counter()
    for s in range(TOKENS):
        finish = vllm.FinishReason.LENGTH if s == TOKENS - 1 else None
        vllm.step(proc, [(rid, [s], finish) for rid in ids])
    return time.perf_counter() - start


def main():
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    client = Client("udp://127.0.0.1:%d" % sink.getsockname()[1])
    plain, hooked = vllm.output_processor_module(), vllm.output_processor_module()
    observer = plugin.Observer(client, model="m", engine="vllm-0")
    assert plugin.install(hooked, observer)
    # Alternated, so that a burst of load elsewhere on the machine falls on both alike.
    runs = [(drive(plain), drive(hooked)) for _ in range(RUNS)]
    t_plain, t_hooked = min(p for p, _ in runs), min(h for _, h in runs)
    tokens = REQUESTS * TOKENS
    client.close()  # sends what is still queued, so the counts below are final
    st = client.stats()
    sink.close()
    print("vLLM output loop (stand-in at vLLM %s): %.2f us/token plain, %.2f us/token with the plugin: "
          "+%.2f us/token (%d requests x %d tokens, best of %d; client sent %d, dropped %d; plugin errors %d)"
          % (vllm.VLLM_COMMIT[:12], t_plain / tokens * 1e6, t_hooked / tokens * 1e6,
             (t_hooked - t_plain) / tokens * 1e6, REQUESTS, TOKENS, RUNS, st["sent"], st["dropped"],
             observer.errors))


if __name__ == "__main__":
    main()
