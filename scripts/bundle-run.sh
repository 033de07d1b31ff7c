#!/usr/bin/env bash
# fused-attn GPU bundle: the one command to run on the GPU machine (copied into the bundle as run.sh).
#
#   RESULTS_DIR=./results ./run.sh
#
# Needs only an NVIDIA driver >= 580 (plus, optionally, compute-sanitizer and Python with PyTorch); no Rust
# toolchain, no network. Steps, each under `timeout`, all inside one time budget (default 345 s, < 6 min):
#   preflight      fail fast (exit 2, nothing else runs) when there is no usable GPU
#   gpu-info       nvidia-smi, driver version
#   gpu-tests      every test binary with the filter `gpu`, FA_REQUIRE_GPU=1 (a skipped GPU test fails),
#                  tests/poison among them (hidden memory poisoned with NaN/±Inf/FP8 codes: bitwise equal outputs);
#                  the full prefill/decode sweeps and the decode bandwidth test are left to the report, which
#                  runs the same cases through the same library harness (FA_BUNDLE_FULL_TESTS=1: run them here
#                  too, ~1.5 more minutes)
#   emu-vs-gpu     tests/gpu_vs_emulator: the same kernels and inputs on the GPU and the host emulator
#   report         fused-attn report --backend gpu --json --plot: the full correctness sweeps and the timed
#                  shapes against the copy bandwidth -> report.jsonl, prefill.png, decode.png; on an H100/H200
#                  the sweep runs the sm_90a prefill kernel (`--kernel auto`) and every timed prefill shape
#                  runs on both kernels -> sm90-vs-sm80.txt, and every D 128 sm90 shape again with each
#                  tuning step off (persistent grid, 128 x 176 tile, TMA-store epilogue, L2 hints) -> sm90-steps.txt
#   torch-compare  tools/torch_compare.py: PyTorch SDPA flash/cuDNN on the same shapes, bf16 matmul ceiling
#                  (then `fused-attn plot` redraws prefill.png with that ceiling)
#   sanitizer      compute-sanitizer memcheck + racecheck on a small prefill and decode (if present); last, so
#                  that a slow sanitizer can only cost itself its time
#   benches        criterion benches (only with FA_BUNDLE_BENCHES=1; ~3 more minutes, outside the budget)
# It continues past a failing step, prints a summary table LAST, and exits 0 only if every step passed
# (1: a step failed or did not fit in the budget; 2: no GPU; 4: the bundle is incomplete).
# Everything goes to $RESULTS_DIR: log.txt (all output), summary.txt, report.jsonl, *.png, compare.jsonl,
# ceilings.json, gpu-info.txt, sanitizer-*.txt.
#
# Overrides (for running from a source tree, as runner/tests/cli/bundle.rs does): BUNDLE_DIR (default: this script's
# directory; its binaries.tar.xz is unpacked into a temporary directory, else BUNDLE_DIR/{bin,tests,benches}
# are used), FA_RUNNER (default: bin/fused-attn there), FA_BUNDLE_BUDGET_S.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUNDLE_DIR="${BUNDLE_DIR:-$here}"
# Where bin/, tests/ and benches/ are: the bundle ships them as one xz tarball (see scripts/gpu-bundle for
# why), unpacked by the preflight on every run; without the tarball, BUNDLE_DIR itself.
BIN_ROOT="$BUNDLE_DIR"
PAYLOAD="$BUNDLE_DIR/binaries.tar.xz"
RESULTS_DIR="${RESULTS_DIR:-./results}"
BUDGET_S="${FA_BUNDLE_BUDGET_S:-345}"
mkdir -p "$RESULTS_DIR" || { echo "run.sh: cannot create RESULTS_DIR=$RESULTS_DIR" >&2; exit 4; }
RESULTS_DIR="$(cd "$RESULTS_DIR" && pwd)"
LOG="$RESULTS_DIR/log.txt"
SUMMARY="$RESULTS_DIR/summary.txt"
START=$(date +%s)
DEADLINE=$((START + BUDGET_S))

# The small problems the preflight probe and the sanitizer run (the runner's `run` verb, issue 6).
PREFILL_ARGS=(--op prefill --dtype bf16 --head-dim 128 --batch 1 --heads 8 --kv-heads 2 --seqlen-q 256
              --seqlen-k 256 --causal)
DECODE_ARGS=(--op decode --dtype bf16 --head-dim 128 --batch 2 --heads 8 --kv-heads 2 --seqlen-k 1000
             --page-size 16)

NAMES=() STATUSES=() SECS=() NOTES=() KEYS=()
GPU_NAME="" DRIVER=""

record() { NAMES+=("$1"); STATUSES+=("$2"); SECS+=("$3"); NOTES+=("$4"); }
now() { date +%s; }
# Seconds a command started now may take: what is left of the current step, at least 1.
left() { local t=$((STEP_DEADLINE - $(now))); ((t < 1)) && t=1; echo "$t"; }
# timeout with the step's remaining time; exit 124 means it ran out.
tmo() { timeout -k 5 "$(left)" "$@"; }

summary() {
  local total=$(($(now) - START)) i rc_text="$1"
  {
    echo
    echo "==================== fused-attn GPU bundle: summary ===================="
    echo "commit:  $(cat "$BUNDLE_DIR/COMMIT" 2>/dev/null || echo unknown)"
    echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)   host: $(hostname 2>/dev/null || echo ?)"
    [ -n "$GPU_NAME" ] && echo "gpu:     $GPU_NAME   driver: $DRIVER"
    printf '%-14s %-8s %7s  %s\n' step status seconds notes
    for i in "${!NAMES[@]}"; do
      printf '%-14s %-8s %7s  %s\n' "${NAMES[$i]}" "${STATUSES[$i]}" "${SECS[$i]}" "${NOTES[$i]}"
    done
    if [ "${#KEYS[@]}" -gt 0 ]; then
      echo "key numbers:"
      for i in "${KEYS[@]}"; do echo "  $i"; done
    fi
    echo "total:   ${total} s   results: $RESULTS_DIR   $rc_text"
  } | tee "$SUMMARY"
}

# ------------------------------------------------------------------------------------------- preflight

no_gpu() {
  echo
  echo "run.sh: NO GPU: $1"
  echo "run.sh: this bundle must run on a machine with an NVIDIA GPU (sm_80 or newer) and driver >= 580."
  echo "run.sh: nothing was run (exit 2)."
  record preflight FAIL "$(($(now) - START))" "NO GPU: $1"
  summary "exit 2 (no GPU)"
  exit 2
}

libcuda_found() {
  local d
  if command -v ldconfig >/dev/null 2>&1 && ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then return 0; fi
  local IFS=:
  for d in ${LD_LIBRARY_PATH:-} /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib \
           /usr/local/cuda/compat /usr/local/cuda/lib64 /usr/lib/wsl/lib; do
    [ -n "$d" ] && compgen -G "$d/libcuda.so*" >/dev/null && return 0
  done
  return 1
}

preflight() {
  local t0 out rc
  t0=$(now)
  STEP_DEADLINE=$((t0 + 60))
  echo "=== [preflight] ==="
  if [ -f "$PAYLOAD" ]; then
    # Unpacked outside the bundle (which stays small enough to copy around) and removed at exit.
    BIN_ROOT="$(mktemp -d "${TMPDIR:-/tmp}/fused-attn-bundle.XXXXXX")"
    trap 'rm -rf "$BIN_ROOT"' EXIT
    # xz if present, else Python's tarfile (the standard library reads .tar.xz).
    if command -v xz >/dev/null 2>&1; then
      xz -dc "$PAYLOAD" | tar -x -C "$BIN_ROOT"
    else
      python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$PAYLOAD" "$BIN_ROOT"
    fi || echo "run.sh: cannot unpack $PAYLOAD"
    echo "unpacked $PAYLOAD into $BIN_ROOT ($(du -sh "$BIN_ROOT" 2>/dev/null | cut -f1))"
  fi
  RUNNER="${FA_RUNNER:-$BIN_ROOT/bin/fused-attn}"
  if [ ! -x "$RUNNER" ]; then
    echo "run.sh: bundle incomplete: runner $RUNNER missing (build it with scripts/gpu-bundle)"
    record preflight FAIL 0 "bundle incomplete: no runner"
    summary "exit 4 (bundle incomplete)"
    exit 4
  fi
  command -v nvidia-smi >/dev/null 2>&1 || no_gpu "nvidia-smi not found on PATH (no NVIDIA driver installed?)"
  out=$(tmo nvidia-smi -L 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] && echo "$out" | grep -q '^GPU ' || no_gpu "nvidia-smi -L lists no GPU (exit $rc): $(echo "$out" | head -1)"
  libcuda_found || no_gpu "libcuda.so (the CUDA driver library) not found by ldconfig or in the usual directories"
  # The authoritative probe: the runner opens a context through the same code every test uses.
  out=$(tmo "$RUNNER" run --backend gpu --no-timing "${DECODE_ARGS[@]}" 2>&1); rc=$?
  echo "$out" | tail -5
  if [ $rc -ne 0 ] && echo "$out" | grep -Eqi 'NoDriver|NoDevice|no CUDA driver|no usable GPU|kernels need sm_80'; then
    no_gpu "the runner cannot use the GPU: $(echo "$out" | grep -Ei 'NoDriver|NoDevice|driver|GPU' | head -1)"
  fi
  if [ $rc -ne 0 ] && echo "$out" | grep -Eqi 'no kernel image|Arch error'; then
    no_gpu "this GPU's architecture is not in the bundle (FA_CUDA_ARCHS at build time): $(echo "$out" | head -1)"
  fi
  if [ $rc -ne 0 ]; then
    record preflight FAIL "$(($(now) - t0))" "runner probe failed (exit $rc), continuing"
  else
    record preflight ok "$(($(now) - t0))" "GPU visible; runner probe ok"
  fi
}

# --------------------------------------------------------------------------------------------- steps

step_gpu_info() {
  tmo nvidia-smi | tee "$RESULTS_DIR/gpu-info.txt"
  tmo nvidia-smi -q >> "$RESULTS_DIR/gpu-info.txt" 2>&1
  GPU_NAME=$(tmo nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  DRIVER=$(tmo nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)
  local sm
  sm=$(tmo nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1)
  NOTE="$GPU_NAME, driver $DRIVER, compute capability $sm"
  KEYS+=("gpu: $GPU_NAME, driver $DRIVER, cc $sm")
  if [ -n "$DRIVER" ] && [ "${DRIVER%%.*}" -lt 580 ] 2>/dev/null; then
    NOTE="$NOTE; WARNING driver < 580 (CUDA 13 kernels need 580+)"
  fi
  return 0
}

# Sums "test result: ... N passed; M failed" over the lines of one libtest output.
count_tests() { awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
                     END { printf "%d %d\n", p, f }' "$1"; }

step_gpu_tests() {
  local bin name rc failed=0 passed=0 nfail=0 p f out skips=()
  # What the report step repeats exactly (same cases, same harness): run once, there.
  [ "${FA_BUNDLE_FULL_TESTS:-0}" = 1 ] || skips=(--skip gpu_sweep --skip gpu_decode_sweep --skip gpu_decode_bandwidth)
  export FA_REQUIRE_GPU=1 FA_SKIP_LOG="$RESULTS_DIR/gpu-skips.txt"
  : > "$FA_SKIP_LOG"
  for bin in "$BIN_ROOT"/tests/*; do
    name=$(basename "$bin")
    [ -x "$bin" ] || continue
    [ "$name" = gpu_vs_emulator ] && continue # its own step
    echo "--- tests/$name gpu ${skips[*]+${skips[*]}}"
    out="$RESULTS_DIR/tests-$name.txt"
    # One test at a time: the timing tests print bandwidth that concurrent tests would distort (the
    # prefill sweep parallelises its fp64 reference internally).
    tmo "$bin" gpu --test-threads=1 ${skips[@]+"${skips[@]}"} 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    read -r p f < <(count_tests "$out")
    passed=$((passed + p)); nfail=$((nfail + f))
    if [ "$rc" -ne 0 ]; then
      failed=$((failed + 1))
      [ "$rc" -eq 124 ] && echo "tests/$name: TIMED OUT" && NOTE="${NOTE:+$NOTE; }tests/$name timed out"
      [ "$rc" -ne 124 ] && NOTE="${NOTE:+$NOTE; }tests/$name exit $rc"
    fi
  done
  if [ -s "$FA_SKIP_LOG" ]; then
    failed=$((failed + 1)); NOTE="${NOTE:+$NOTE; }skipped GPU tests: $(sort -u "$FA_SKIP_LOG" | tr '\n' ' ')"
  fi
  if [ "$passed" -eq 0 ]; then
    failed=$((failed + 1)); NOTE="${NOTE:+$NOTE; }no GPU test ran"
  fi
  NOTE="$passed passed, $nfail failed${skips[*]:+ (sweeps: see report)}${NOTE:+; $NOTE}"
  KEYS+=("GPU tests: $passed passed, $nfail failed")
  [ "$failed" -eq 0 ]
}

step_emu_vs_gpu() {
  local bin="$BIN_ROOT/tests/gpu_vs_emulator" out="$RESULTS_DIR/emu-vs-gpu.txt" rc p f
  [ -x "$bin" ] || { NOTE="tests/gpu_vs_emulator missing from the bundle"; return 1; }
  FA_REQUIRE_GPU=1 tmo "$bin" gpu --test-threads=1 --nocapture 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  read -r p f < <(count_tests "$out")
  NOTE="$p passed, $f failed; $(grep -c 'bit-identical' "$out") outputs compared"
  [ "$rc" -eq 124 ] && NOTE="$NOTE; TIMED OUT"
  [ "$rc" -eq 0 ] && [ "$p" -gt 0 ]
}

find_sanitizer() {
  local c
  for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer \
           /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [ -n "$c" ] && [ -x "$c" ] && { echo "$c"; return 0; }
  done
  return 1
}

step_sanitizer() {
  local cs tool what rc bad=0 runs=0 out
  cs=$(find_sanitizer) || { NOTE="compute-sanitizer not found"; return 3; }
  echo "using $cs"
  for tool in memcheck racecheck; do
    for what in prefill decode; do
      out="$RESULTS_DIR/sanitizer-$tool-$what.txt"
      if [ "$what" = prefill ]; then set -- "${PREFILL_ARGS[@]}"; else set -- "${DECODE_ARGS[@]}"; fi
      echo "--- $tool: fused-attn run --backend gpu --no-timing $*"
      tmo "$cs" --tool "$tool" --error-exitcode 99 "$RUNNER" run --backend gpu --no-timing "$@" > "$out" 2>&1
      rc=$?
      tail -4 "$out"
      runs=$((runs + 1))
      if [ "$rc" -ne 0 ]; then
        bad=$((bad + 1)); NOTE="${NOTE:+$NOTE; }$tool $what exit $rc"
      fi
    done
  done
  # The same on the emulator-comparison tests' kernels (independent of the runner): prefill, decode,
  # merge and append launches.
  for tool in memcheck racecheck; do
    out="$RESULTS_DIR/sanitizer-$tool-tests.txt"
    echo "--- $tool: tests/gpu_vs_emulator (prefill, decode, merge, append)"
    FA_REQUIRE_GPU=1 tmo "$cs" --tool "$tool" --error-exitcode 99 "$BIN_ROOT/tests/gpu_vs_emulator" \
      gpu_vs_emu_ --skip selftest --test-threads=1 > "$out" 2>&1
    rc=$?
    tail -4 "$out"
    runs=$((runs + 1))
    [ "$rc" -ne 0 ] && { bad=$((bad + 1)); NOTE="${NOTE:+$NOTE; }$tool tests exit $rc"; }
  done
  NOTE="$((runs - bad))/$runs clean${NOTE:+; $NOTE}"
  [ "$bad" -eq 0 ]
}

step_report() {
  local json="$RESULTS_DIR/report.jsonl" rc rows failed
  tmo "$RUNNER" report --backend gpu --json --plot "$RESULTS_DIR" > "$json"
  rc=$?
  rows=$(grep -c '^{' "$json")
  failed=$(grep '^{' "$json" | grep -c '"passed":false')
  NOTE="exit $rc, $rows rows, $failed failed"
  for png in prefill.png decode.png; do
    [ -s "$RESULTS_DIR/$png" ] || { NOTE="$NOTE; $png missing"; rc=1; }
  done
  if command -v python3 >/dev/null 2>&1 && [ "$rows" -gt 0 ]; then
    python3 - "$json" > "$RESULTS_DIR/report-keys.txt" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def f(x):
    try:
        return float(x)
    except (TypeError, ValueError):
        return None
pre = [r for r in rows if r.get("op") == "prefill" and f(r.get("tflops"))]
dec = [r for r in rows if r.get("op") == "decode" and f(r.get("pct_of_copy_bw"))]
if pre:
    best = max(pre, key=lambda r: f(r["tflops"]))
    print(f"prefill best: {f(best['tflops']):.1f} TFLOPS ({best['dtype']} D={best['head_dim']} B={best['batch']} "
          f"Hq={best['heads_q']} T={best['seqlen_q']} causal={best['causal']})")
# On an H100/H200 the report times each prefill shape on both kernels (labels "sm80 ..." / "sm90 ..."): the
# best of each here, every shape side by side in sm90-vs-sm80.txt (docs/performance.md's measured column).
kernel = lambda r: str(r.get("label", "")).split(" ", 1)[0]
pairs = {}
for r in pre:
    if kernel(r) in ("sm80", "sm90") and r["seqlen_q"] == r["seqlen_k"]:  # the family, not the paged baselines
        shape = (r["dtype"], r["head_dim"], r["batch"], r["heads_q"], r["heads_kv"], r["seqlen_q"], r["causal"])
        pairs.setdefault(shape, {})[kernel(r)] = f(r["tflops"])
for k in ("sm90", "sm80"):
    ts = [t[k] for t in pairs.values() if k in t]
    if ts:
        print(f"prefill best {k} kernel: {max(ts):.1f} TFLOPS")
if pairs:
    import os
    with open(os.path.join(os.path.dirname(sys.argv[1]), "sm90-vs-sm80.txt"), "w") as out:
        out.write("| dtype | D | B | Hq | Hkv | T | causal | sm90 TFLOPS | sm80 TFLOPS |\n|---|---|---|---|---|---|---|---|---|\n")
        for shape, t in sorted(pairs.items()):
            cells = " | ".join(str(x) for x in shape)
            out.write(f"| {cells} | {t.get('sm90', 0):.1f} | {t.get('sm80', 0):.1f} |\n")
# The sm90 kernel's tuning steps A/B (labels "sm90-no-<step> ..."; docs/hopper.md's step table): each row's
# time against the same shape with every step on.
steps = [r for r in pre if kernel(r).startswith("sm90-no-")]
if steps:
    import os
    with open(os.path.join(os.path.dirname(sys.argv[1]), "sm90-steps.txt"), "w") as out:
        out.write("| step off | dtype | D | B | Hq | T | causal | TFLOPS | time vs all steps on |\n|---|---|---|---|---|---|---|---|---|\n")
        for r in steps:
            ratio = f(r.get("vs_baseline"))
            cells = " | ".join(str(r[k]) for k in ("dtype", "head_dim", "batch", "heads_q", "seqlen_q", "causal"))
            out.write(f"| {kernel(r)[len('sm90-no-'):]} | {cells} | {f(r['tflops']):.1f} | {ratio:.3f}x |\n" if ratio else
                      f"| {kernel(r)[len('sm90-no-'):]} | {cells} | {f(r['tflops']):.1f} | - |\n")
            print(f"sm90 step A/B: {r['label']}: {f(r['tflops']):.1f} TFLOPS, " + (f"{ratio:.3f}x the time with it on" if ratio else "no ratio"))
for r in dec:
    kv = r.get("kv_dtype") or r["dtype"]
    print(f"decode {kv} B={r['batch']} ctx={r['seqlen_k']} page={r.get('page_size')}: {f(r.get('gbps')) or 0:.0f} GB/s = "
          f"{f(r['pct_of_copy_bw']):.0f}% of copy bandwidth"
          + (f", {f(r.get('vs_baseline')):.2f}x the bf16 time" if f(r.get("vs_baseline")) else ""))
# Paged prefill rows (chunks vs the dense prefill of the same pairs; spec-verify vs one decode step), each with
# its time over its baseline's (vs_baseline; docs/performance.md's bars: chunks <= 1.1, spec-verify <= 1.3).
for r in rows:
    if r.get("op") == "paged-prefill" and r.get("kind") == "perf":
        ratio = f(r.get("vs_baseline"))
        base = str(r.get("baseline") or "").split(" ", 1)[0]
        print(f"paged-prefill B={r['batch']} q={r['seqlen_q']} ctx={r['seqlen_k']} page={r.get('page_size')}: "
              f"{f(r.get('tflops')) or 0:.1f} TFLOPS"
              + (f", {ratio:.2f}x the time of {'dense prefill' if base == 'prefill' else 'one decode step'}" if ratio else
                 f" (no ratio: {r.get('error') or 'baseline not timed'})"))
EOF
    mapfile -t more < "$RESULTS_DIR/report-keys.txt"
    cat "$RESULTS_DIR/report-keys.txt"
    KEYS+=("${more[@]}")
  fi
  [ "$rc" -eq 0 ] && [ "$rows" -gt 0 ] && [ "$failed" -eq 0 ]
}

step_torch() {
  local out="$RESULTS_DIR/torch_compare.txt" rc
  command -v python3 >/dev/null 2>&1 || { NOTE="python3 not found"; return 3; }
  [ -s "$RESULTS_DIR/report.jsonl" ] || { NOTE="no report.jsonl to compare (report step failed)"; return 1; }
  tmo python3 "$BUNDLE_DIR/torch_compare.py" "$RESULTS_DIR/report.jsonl" --out "$RESULTS_DIR/compare.jsonl" \
    --ceiling-out "$RESULTS_DIR/ceilings.json" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 3 ]; then NOTE=$(grep -m1 SKIPPED "$out"); return 3; fi
  local mm
  mm=$(grep -m1 'ceiling: bf16 matmul' "$out" | sed 's/.*: //')
  [ -n "$mm" ] && KEYS+=("bf16 matmul ceiling (torch, same run): $mm")
  # Redraw the report's plots with the matmul ceiling just measured (the report ran before it existed).
  local mmj
  mmj=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["matmul_bf16_tflops"])' \
        "$RESULTS_DIR/ceilings.json" 2>/dev/null) &&
    tmo "$RUNNER" plot "$RESULTS_DIR/report.jsonl" --out "$RESULTS_DIR" --matmul-tflops "$mmj"
  local n
  n=$(grep -c . "$RESULTS_DIR/compare.jsonl" 2>/dev/null)
  NOTE="exit $rc, ${n:-0} rows compared"
  [ "$rc" -eq 0 ]
}

step_benches() {
  local b rc bad=0 mm
  mm=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["matmul_bf16_tflops"])' \
       "$RESULTS_DIR/ceilings.json" 2>/dev/null) && export FA_MATMUL_TFLOPS="$mm"
  export CRITERION_HOME="$RESULTS_DIR/criterion"
  for b in prefill decode; do
    tmo "$BIN_ROOT/benches/$b" --bench 2>&1 | tee "$RESULTS_DIR/bench-$b.txt"
    rc=${PIPESTATUS[0]}
    [ "$rc" -ne 0 ] && { bad=1; NOTE="${NOTE:+$NOTE; }$b exit $rc"; }
    grep -q '^no GPU:' "$RESULTS_DIR/bench-$b.txt" && { bad=1; NOTE="${NOTE:+$NOTE; }$b found no GPU"; }
  done
  [ "$bad" -eq 0 ]
}

# run_step NAME CAP_SECONDS FUNCTION: runs FUNCTION with STEP_DEADLINE = now + min(CAP, what is left of the
# budget); its return code says ok (0), skipped (3) or FAIL (anything else); NOTE is its summary note.
run_step() {
  local name=$1 cap=$2 fn=$3 t0 rc status room
  t0=$(now)
  room=$((DEADLINE - t0))
  ((room < cap)) && cap=$room
  if ((cap < 5)); then
    echo "=== [$name] not run: the ${BUDGET_S} s budget is used up ==="
    record "$name" FAIL 0 "not run: time budget used up"
    return
  fi
  echo
  echo "=== [$name] (limit ${cap} s) ==="
  STEP_DEADLINE=$((t0 + cap))
  NOTE=""
  "$fn"
  rc=$?
  case $rc in
    0) status=ok ;;
    3) status=skipped ;;
    *) status=FAIL ;;
  esac
  (($(now) >= STEP_DEADLINE)) && [ "$status" = FAIL ] && NOTE="${NOTE:+$NOTE; }hit its ${cap} s limit"
  record "$name" "$status" "$(($(now) - t0))" "$NOTE"
}

main() {
  echo "fused-attn GPU bundle run: $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(cat "$BUNDLE_DIR/COMMIT" 2>/dev/null || echo unknown)"
  echo "bundle: $BUNDLE_DIR   results: $RESULTS_DIR   budget: ${BUDGET_S} s"
  preflight
  run_step gpu-info 20 step_gpu_info
  run_step gpu-tests 90 step_gpu_tests
  run_step emu-vs-gpu 45 step_emu_vs_gpu
  run_step report 170 step_report
  run_step torch-compare 60 step_torch
  run_step sanitizer 70 step_sanitizer
  if [ "${FA_BUNDLE_BENCHES:-0}" = 1 ]; then
    DEADLINE=$(($(now) + 400)) # outside the default budget: the caller asked for it
    run_step benches 400 step_benches
  fi
  local i fail=0
  for i in "${!STATUSES[@]}"; do [ "${STATUSES[$i]}" = FAIL ] && fail=1; done
  if [ "$fail" -eq 0 ]; then summary "exit 0 (all steps ok or skipped)"; else summary "exit 1 (a step FAILED)"; fi
  return "$fail"
}

# Everything to the console and to log.txt (the script runs itself behind tee, so the log is complete when
# it exits); the summary table is the last thing printed.
if [ -z "${FA_RUN_SH_INNER:-}" ]; then
  FA_RUN_SH_INNER=1 RESULTS_DIR="$RESULTS_DIR" bash "${BASH_SOURCE[0]}" "$@" 2>&1 | tee "$LOG"
  exit "${PIPESTATUS[0]}"
fi
main
