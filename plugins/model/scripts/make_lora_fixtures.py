"""LoRA parity fixtures, made with PEFT on the parity fixtures' small random models (CPU, f32).

Two directions, each checked by `plugins/model/tests/lora_parity.rs` without Python:

* PEFT → areal-rs: for each case below PEFT puts adapters on a parity model (random `A` and
  `B`: `init_lora_weights=False`, so that the adapter changes the logits), saves them as it
  saves any adapter (`adapter_config.json`, `adapter_model.safetensors`) under
  `tests/fixtures/lora/<case>/adapter/`, and writes the adapted model's logits to
  `expected.json`.
* areal-rs → PEFT: `tests/fixtures/lora/areal-qwen2/adapter/` is written by areal-rs
  (`AREAL_WRITE_LORA_FIXTURE=1 cargo test -p areal-model --test lora_parity`, before this
  script); PEFT loads it over the same base with `PeftModel.from_pretrained` and writes its
  logits to that case's `expected.json`.

    plugins/model/scripts/setup-transformers.sh
    AREAL_WRITE_LORA_FIXTURE=1 cargo test -p areal-model --test lora_parity
    .cache/transformers/bin/python plugins/model/scripts/make_lora_fixtures.py
"""

import json
import os
import sys

import peft
import torch
import transformers

HERE = os.path.dirname(__file__)
PARITY = os.path.join(HERE, "..", "tests", "fixtures", "parity")
OUT = os.path.join(HERE, "..", "tests", "fixtures", "lora")

PROMPTS = [
    [1, 17, 42, 5, 88, 23, 9],
    [1] + [(7 * i + 3) % 96 for i in range(40)],
]

# case -> (parity family, LoraConfig fields); None: the adapter is areal-rs's
CASES = {
    "peft-qwen2": (
        "qwen2",
        dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"]),
    ),
    "peft-llama3-rslora": (
        "llama3",
        dict(r=2, lora_alpha=16, target_modules="all-linear", use_rslora=True),
    ),
    "areal-qwen2": ("qwen2", None),
}


def logits(model, prompt):
    with torch.no_grad():
        out = model(torch.tensor([prompt])).logits[0]
    return [[round(float(x), 7) for x in row] for row in out]


def main() -> int:
    torch.set_num_threads(1)
    for case, (family, fields) in CASES.items():
        base = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.join(PARITY, family), dtype=torch.float32
        ).eval()
        folder = os.path.join(OUT, case)
        adapter = os.path.join(folder, "adapter")
        if fields is None:
            if not os.path.exists(os.path.join(adapter, "adapter_config.json")):
                print(f"{case}: run the Rust test with AREAL_WRITE_LORA_FIXTURE=1 first", file=sys.stderr)
                return 1
            model = peft.PeftModel.from_pretrained(base, adapter).eval()
        else:
            torch.manual_seed(7)
            config = peft.LoraConfig(
                task_type="CAUSAL_LM", lora_dropout=0.0, init_lora_weights=False, **fields
            )
            model = peft.get_peft_model(base, config).eval()
            os.makedirs(folder, exist_ok=True)
            model.save_pretrained(adapter)
            # the base as the fixtures name it, not this machine's path to it
            path = os.path.join(adapter, "adapter_config.json")
            with open(path) as f:
                saved = json.load(f)
            saved["base_model_name_or_path"] = f"parity/{family}"
            with open(path, "w") as f:
                json.dump(saved, f, indent=2, sort_keys=True)
                f.write("\n")
        with open(os.path.join(folder, "expected.json"), "w") as f:
            json.dump(
                {
                    "made_with": {
                        "torch": torch.__version__,
                        "transformers": transformers.__version__,
                        "peft": peft.__version__,
                    },
                    "family": family,
                    "cases": [{"prompt": p, "logits": logits(model, p)} for p in PROMPTS],
                },
                f,
            )
            f.write("\n")
        print(f"{case}: {family} + adapter -> {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
