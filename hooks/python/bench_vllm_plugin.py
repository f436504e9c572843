"""What the vLLM plugin costs per token in the engine's process: `python3 bench_vllm_plugin.py`.

It drives the stand-in of vLLM's output processor from test_otelcol_llm_vllm (shaped as vLLM's at commit
d0782260) through DELTA streams, 64 concurrent requests of 256 tokens, one token per request per step, as vLLM's
API server process sees them, once plain and once with the plugin installed, sending to a UDP socket on loopback.
The figure is the difference per token, best of 5 runs: the time the wrappers add to vLLM's loop (the client's
sender thread runs beside it, and its share of the GIL is in the figure).
"""

import socket
import time
import types

import otelcol_llm_vllm as plugin
from otelcol_llm_hook import Client
from test_otelcol_llm_vllm import (EngineCoreOutput, FinishReason, OutputProcessor, RequestOutputKind, RequestState,
                                   request)

REQUESTS, TOKENS, RUNS = 64, 256, 5


def drive(mod):
    proc = mod.OutputProcessor()
    ids = ["b%d" % i for i in range(REQUESTS)]
    for rid in ids:
        proc.add_request(request(rid, RequestOutputKind.DELTA), None)
        proc.request_states[rid].__class__ = mod.RequestState
    start = time.perf_counter()
    for step in range(TOKENS):
        last = step == TOKENS - 1
        proc.process_outputs([EngineCoreOutput(request_id=rid, new_token_ids=[step],
                                               finish_reason=FinishReason.LENGTH if last else None) for rid in ids])
    return time.perf_counter() - start


def best(mod):
    return min(drive(mod) for _ in range(RUNS))


def main():
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    client = Client("udp://127.0.0.1:%d" % sink.getsockname()[1])
    plain = types.SimpleNamespace(OutputProcessor=type("P", (OutputProcessor,), {}),
                                  RequestState=type("S", (RequestState,), {}))
    hooked = types.SimpleNamespace(OutputProcessor=type("P", (OutputProcessor,), {}),
                                   RequestState=type("S", (RequestState,), {}))
    plugin.install(hooked, plugin.Observer(client, model="m", engine="vllm-0"))
    t_plain, t_hooked = best(plain), best(hooked)
    tokens = REQUESTS * TOKENS
    st = client.stats()
    client.close()
    sink.close()
    print("vLLM output loop (stand-in): %.2f us/token plain, %.2f us/token with the plugin: +%.2f us/token "
          "(%d requests x %d tokens, best of %d; client sent %d, dropped %d)"
          % (t_plain / tokens * 1e6, t_hooked / tokens * 1e6, (t_hooked - t_plain) / tokens * 1e6,
             REQUESTS, TOKENS, RUNS, st["sent"], st["dropped"]))


if __name__ == "__main__":
    main()
