"""PyTorch eager's side of `areal bench model`: the same transformer configs in transformers'
Qwen2 implementation, f32 on the CPU, with the same thread count, timed on the same work:

- prefill: one forward pass over B prompts of T tokens (tokens/s = B·T / seconds);
- cached decode: B sequences, prefilled with 16 tokens, then 32 steps of one token each with
  the key/value cache (tokens/s = B·32 / seconds);
- training: forward, backward and an AdamW step on B sequences of T tokens.

    plugins/model/scripts/setup-transformers.sh
    .cache/transformers/bin/python plugins/model/scripts/bench_pytorch.py [--threads 2] [--out F]

Prints one JSON object per measurement (and writes them to --out as JSON lines). Each
figure is the median of --rounds rounds after one warm-up round.
"""

import argparse
import json
import statistics
import sys
import time

import torch
import transformers

# The same shapes as `areal bench model` (Qwen2 layout: q/k/v biases, tied embeddings).
CONFIGS = {
    # the built-in job's model: chain-sum's 54 characters + <unk> + <eos>
    "built-in 0.1M": dict(vocab_size=56, hidden_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=176, max_position_embeddings=256),
    "10M": dict(vocab_size=8192, hidden_size=256, num_hidden_layers=10,
                num_attention_heads=8, num_key_value_heads=4,
                intermediate_size=688, max_position_embeddings=512),
    "100M": dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12,
                 num_attention_heads=12, num_key_value_heads=4,
                 intermediate_size=2048, max_position_embeddings=512),
}


def model_for(fields):
    config = transformers.Qwen2Config(
        **fields, tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-6,
        use_sliding_window=False, torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).float()
    model.config._attn_implementation = "sdpa"
    return model


def timed(fn, rounds):
    fn()  # warm-up
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--out")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []

    def emit(**row):
        row.update(threads=args.threads, torch=torch.__version__)
        rows.append(row)
        print(json.dumps(row), flush=True)

    for name in args.configs.split(","):
        fields = CONFIGS[name]
        model = model_for(fields)
        params = sum(p.numel() for p in model.parameters())
        vocab = fields["vocab_size"]
        g = torch.Generator().manual_seed(1)
        model.eval()
        for batch, length in ((1, 128), (32, 128)):
            ids = torch.randint(0, vocab, (batch, length), generator=g)

            def prefill():
                with torch.no_grad():
                    model(input_ids=ids, use_cache=False)

            s = timed(prefill, args.rounds)
            emit(config=name, params=params, what="prefill", batch=batch, tokens=length,
                 seconds=s, tokens_per_s=batch * length / s)
        for batch in (1, 32):
            prompt = torch.randint(0, vocab, (batch, 16), generator=g)
            steps = 32

            def decode():
                with torch.no_grad():
                    out = model(input_ids=prompt, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1:].argmax(-1)
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        out = model(input_ids=nxt, past_key_values=past, use_cache=True)
                        past = out.past_key_values
                        nxt = out.logits[:, -1:].argmax(-1)
                    return time.perf_counter() - t0

            decode()  # warm-up
            s = statistics.median(decode() for _ in range(args.rounds))
            emit(config=name, params=params, what="cached decode", batch=batch, tokens=steps,
                 seconds=s, tokens_per_s=batch * steps / s)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        batch, length = 8, 128
        ids = torch.randint(0, vocab, (batch, length), generator=g)

        def train():
            optimizer.zero_grad(set_to_none=True)
            logits = model(input_ids=ids, use_cache=False).logits
            logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])
            (-logp.mean()).backward()
            optimizer.step()

        s = timed(train, args.rounds)
        emit(config=name, params=params, what="training", batch=batch, tokens=length,
             seconds=s, tokens_per_s=batch * length / s)
    if args.out:
        with open(args.out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
