#!/usr/bin/env bash
# Fuzz one target of tests/fuzz for a while: tests/fuzz/run.sh TARGET SECONDS [JOBS]
# TARGET: record | expected_output | math | weight_parts | inference_answers | state_json.
# Installs cargo-fuzz from crates.io when missing.
# libFuzzer needs unstable compiler flags: RUSTC_BOOTSTRAP=1 lets the stable toolchain take
# them. The corpus grows in .cache/fuzz/corpus/TARGET; a crash is written to
# .cache/fuzz/artifacts/TARGET and the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/../.."
target="${1:?usage: tests/fuzz/run.sh record|expected_output|math|weight_parts|inference_answers|state_json SECONDS [JOBS]}"
seconds="${2:-600}"
jobs="${3:-1}"
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi
corpus=".cache/fuzz/corpus/$target"
artifacts=".cache/fuzz/artifacts/$target"
mkdir -p "$corpus" "$artifacts"
# Seed the corpus with real inputs.
case "$target" in
    record)
        cp rewards/code/tests/fixtures/lcb_official_record_1873A.json "$corpus/official.json"
        head -n 3 rewards/code/tests/fixtures/lcb_reference.jsonl | split -l 1 - "$corpus/reference-" ;;
    expected_output)
        printf '%s' '[1, [2.5, "x"], {"a": null, "b": [true, false]}, 1e400, -0.0]' >"$corpus/json"
        printf '%s' '{"d": [{"i": "1"}, {"t": [{"f": "-inf"}, "s"]}, "k", {"e": [{"i": "2"}]}]}' >"$corpus/guest"
        printf '1.50 2\n3e-5 x\n' >"$corpus/lines" ;;
    math)
        head -n 200 rewards/math/tests/fixtures/math_verify_cases.jsonl |
            python3 -c 'import json,sys
for i, l in enumerate(sys.stdin):
    c = json.loads(l)
    open(sys.argv[1] + "/case-%03d" % i, "w").write(c["gold"] + "\0" + c["pred"])' "$corpus" ;;
    weight_parts)
        # a real update's chunks, length-delimited, as the seed
        cargo run --quiet --release --locked -p areal-proto --example weight_stream >"$corpus/update" ;;
    inference_answers)
        printf '%s' '{"text":"","output_ids":[5,6],"meta_info":{"id":"r","finish_reason":{"type":"length"},"prompt_tokens":1,"completion_tokens":2,"output_token_logprobs":[[-0.5,5,null],[-1.25,6,null]],"weight_version":"3"}}' >"$corpus/sglang"
        printf '%s' '{"request_id":"r","choices":[{"index":0,"finish_reason":"stop","token_ids":[5],"logprobs":{"content":[{"token":"token_id:5","logprob":-0.5,"top_logprobs":[]}]}}]}' >"$corpus/vllm"
        printf '%s' '{"weight_version":"7"}' >"$corpus/version" ;;
    state_json)
        # the checkpoints of a short run of the testkit job
        run=".cache/fuzz/state-run"
        rm -rf "$run"
        cargo run --quiet --release --locked -p areal -- train -q \
            --config sdk/testkit/testkit.toml \
            --set checkpoint.every=2 --set train.steps=6 --out "$run"
        i=0
        for state in "$run"/checkpoints/*/state.json; do
            cp "$state" "$corpus/state-$i"
            i=$((i + 1))
        done ;;
esac
parallel=()
if [ "$jobs" -gt 1 ]; then
    # libFuzzer's workers log to fuzz-N.log in the working folder: keep those in .cache.
    parallel=(-jobs="$jobs" -workers="$jobs")
fi
RUSTC_BOOTSTRAP=1 cargo fuzz run --fuzz-dir tests/fuzz --release --sanitizer none \
    "$target" "$corpus" -- \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 "${parallel[@]}"
