"""Writes a tiny llama-architecture GGUF with random weights for the tests.

The tokenizer is the one of a vocab-only GGUF that llama.cpp ships
(models/ggml-vocab-llama-spm.gguf), copied key by key; the weights are
random from a fixed seed, so the text is garbage, while the engine's
tokenizing, scheduling, timing and protocol are real. With gguf-py of the
same llama.cpp tree on PYTHONPATH (it needs numpy and PyYAML):

    python3 make_model.py VOCAB.gguf OUT.gguf
"""

import sys

import numpy as np

import gguf

N_LAYER = 2
N_EMBD = 128
N_HEAD = 4
N_FF = 384
N_CTX = 4096

# A plain template the server's Jinja engine renders, so that chat requests
# do not depend on which built-in template a version falls back to.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def copy_tokenizer(vocab_path, w):
    """Copies every tokenizer.* key of the vocab-only GGUF, with its type."""
    r = gguf.GGUFReader(vocab_path)
    n_vocab = 0
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == "tokenizer.ggml.tokens":
            n_vocab = len(value)
        w.add_key_value(key, value, vtype, sub_type=sub)
    if n_vocab == 0:
        sys.exit(f"{vocab_path}: no tokenizer.ggml.tokens")
    return n_vocab


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: make_model.py VOCAB.gguf OUT.gguf")
    vocab_path, out_path = sys.argv[1], sys.argv[2]
    w = gguf.GGUFWriter(out_path, "llama")
    w.add_name("otelcol-llm-tiny-random")
    w.add_block_count(N_LAYER)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(vocab_path, w)
    w.add_vocab_size(n_vocab)
    w.add_chat_template(CHAT_TEMPLATE)

    rng = np.random.default_rng(20261206)

    def matrix(rows, cols):
        # numpy's shape is ggml's reversed: (out, in).
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    def norm():
        return np.ones(N_EMBD, dtype=np.float32)

    # No output.weight: llama.cpp ties the output to token_embd then.
    w.add_tensor("token_embd.weight", matrix(n_vocab, N_EMBD))
    w.add_tensor("output_norm.weight", norm())
    for i in range(N_LAYER):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", matrix(N_EMBD, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_gate.weight", matrix(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_up.weight", matrix(N_FF, N_EMBD))
        w.add_tensor(f"blk.{i}.ffn_down.weight", matrix(N_EMBD, N_FF))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
