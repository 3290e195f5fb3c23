"""Parity fixtures for the model plugin, made with Hugging Face transformers (CPU, f32).

For each family (Qwen2 with q/k/v biases, Qwen3 with q/k RMSNorm and a head width of its own,
Llama 3 with `rope_scaling` of type `llama3`, tied and untied embeddings) a small random model
is built from a config with transformers, saved as it saves any checkpoint (`config.json`,
`model.safetensors`), and run on fixed prompts. `expected.json` holds the logits of every
position and the greedy continuation of 32 tokens; the Rust tests compare against it without
Python:

    plugins/model/scripts/setup-transformers.sh
    .cache/transformers/bin/python plugins/model/scripts/make_parity_fixtures.py

Writes plugins/model/tests/fixtures/parity/<family>/. Deterministic: the same versions write
the same files.
"""

import json
import os
import sys

import torch
import transformers

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "parity")

COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    torch_dtype="float32",
)

FAMILIES = {
    # Qwen2: q/k/v biases, tied embeddings (as the small Qwen2.5 models)
    "qwen2": (
        transformers.Qwen2Config,
        transformers.Qwen2ForCausalLM,
        dict(COMMON, rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False),
    ),
    # Qwen3: no biases, q/k RMSNorm per head, head_dim (16) other than hidden / heads (8)
    "qwen3": (
        transformers.Qwen3Config,
        transformers.Qwen3ForCausalLM,
        dict(
            COMMON,
            head_dim=16,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            attention_bias=False,
            use_sliding_window=False,
        ),
    ),
    # Llama 3: rope_scaling of type llama3, untied embeddings (as Llama 3.1 8B)
    "llama3": (
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        dict(
            COMMON,
            rope_theta=500000.0,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
}

PROMPTS = [
    [1, 17, 42, 5, 88, 23, 9],
    [1, 60],
    [1] + [(7 * i + 3) % 96 for i in range(40)],
]
GREEDY_TOKENS = 32


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random, norms included (a norm of ones would hide a missing one)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.08 * torch.randn(p.shape, generator=g))


def main() -> int:
    torch.set_num_threads(1)
    for family, (config_cls, model_cls, fields) in FAMILIES.items():
        config = config_cls(**fields)
        torch.manual_seed(0)
        model = model_cls(config).float().eval()
        randomise(model, 1234)
        folder = os.path.join(OUT, family)
        os.makedirs(folder, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        for extra in ("generation_config.json",):
            path = os.path.join(folder, extra)
            if os.path.exists(path):
                os.remove(path)
        cases = []
        with torch.no_grad():
            for prompt in PROMPTS:
                ids = torch.tensor([prompt])
                logits = model(ids).logits[0]
                out = model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=False,
                    max_new_tokens=GREEDY_TOKENS,
                    min_new_tokens=GREEDY_TOKENS,
                    eos_token_id=None,
                    pad_token_id=0,
                )
                cases.append(
                    {
                        "prompt": prompt,
                        "logits": [[round(float(x), 7) for x in row] for row in logits],
                        "greedy": out[0, len(prompt) :].tolist(),
                    }
                )
        with open(os.path.join(folder, "expected.json"), "w") as f:
            json.dump(
                {
                    "made_with": {
                        "torch": torch.__version__,
                        "transformers": transformers.__version__,
                        "class": model_cls.__name__,
                    },
                    "cases": cases,
                },
                f,
            )
            f.write("\n")
        print(f"{family}: {sum(p.numel() for p in model.parameters())} parameters -> {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
