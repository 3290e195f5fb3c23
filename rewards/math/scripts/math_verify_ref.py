#!/usr/bin/env python3
"""Math-Verify (the Python reference) on JSONL pairs, for `areal bench math` and for comparing verdicts.

Reads lines {"gold": ..., "pred": ..., "config": {...}?} on stdin and writes one line per input,
{"reward": 0.0|1.0}, in order. `--time N` instead grades the whole input N times and prints one
line {"pairs": n, "rounds": N, "seconds": s, "rewards": [...]}: the time excludes starting
Python and importing sympy, and the rewards are those of the first round.

A case's `config` follows ../shared/data/math/math_verify_cases.jsonl: `match_types`
(latex, expr), `latex_boxed_match_priority`, `float_rounding`, `strict`,
`allow_set_relation_comp`; a missing config or "parse": "default ..." is Math-Verify's defaults.
Installed by rewards/math/scripts/setup-math-verify.sh into .cache/math-verify.
"""
import json
import sys
import time

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify


def targets(config):
    if "match_types" not in config:
        return [LatexExtractionConfig(), ExprExtractionConfig()]
    out = []
    for kind in config["match_types"]:
        if kind == "latex":
            out.append(LatexExtractionConfig(boxed_match_priority=config.get("latex_boxed_match_priority", 50)))
        elif kind == "expr":
            out.append(ExprExtractionConfig())
        else:
            raise ValueError(f"unknown match type {kind!r}")
    return out


def grade(case):
    config = case.get("config") or {}
    extraction = targets(config)
    gold = parse(case["gold"], extraction)
    pred = parse(case["pred"], extraction)
    return verify(
        gold,
        pred,
        float_rounding=config.get("float_rounding", 6),
        strict=config.get("strict", True),
        allow_set_relation_comp=config.get("allow_set_relation_comp", False),
    )


def main():
    cases = [json.loads(line) for line in sys.stdin if line.strip()]
    if len(sys.argv) == 3 and sys.argv[1] == "--time":
        rounds = int(sys.argv[2])
        start = time.perf_counter()
        rewards = []
        for r in range(rounds):
            for case in cases:
                ok = grade(case)
                if r == 0:
                    rewards.append(1.0 if ok else 0.0)
        seconds = time.perf_counter() - start
        print(json.dumps({"pairs": len(cases), "rounds": rounds, "seconds": seconds, "rewards": rewards}))
        return
    for case in cases:
        print(json.dumps({"reward": 1.0 if grade(case) else 0.0}))


if __name__ == "__main__":
    main()
