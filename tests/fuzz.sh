#!/usr/bin/env bash
# Fuzzes Windvane's hostile-input parsers (the targets of fuzz/, see fuzz/README.md) for a bounded time each,
# one target after another in a single process. Exits non-zero when any target crashes, printing the
# reproducer's path; every crash becomes a regression test (fuzz/README.md says how).
#
#   tests/fuzz.sh                 # 20 s per target (CI runs `tests/fuzz.sh 10`)
#   tests/fuzz.sh 600             # 10 min per target
#   tests/fuzz.sh 120 yaml bundle # only these targets
#
# Environment: FUZZ_SANITIZER=address (needs a nightly toolchain; the default, none, works on stable);
# FUZZ_TOOLCHAIN to pick the toolchain (default: the active one, or nightly for a sanitizer); FUZZ_TARGET_DIR
# to build somewhere other than fuzz/target (a directory kept between CI runs makes the build incremental).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
[ "$#" -gt 0 ] && shift
case "$seconds" in
  '' | *[!0-9]*) echo "usage: tests/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2 ;;
esac

if ! command -v cargo-fuzz >/dev/null; then
  echo "installing cargo-fuzz (a few minutes, once)"
  cargo install cargo-fuzz --locked --version 0.13.2
fi

sanitizer="${FUZZ_SANITIZER:-none}"
toolchain="${FUZZ_TOOLCHAIN:-}"
if [ -z "$toolchain" ] && [ "$sanitizer" != none ]; then
  toolchain=nightly # -Zsanitizer is nightly-only
fi
cargo_cmd=(cargo)
[ -n "$toolchain" ] && cargo_cmd+=("+$toolchain")

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <("${cargo_cmd[@]}" fuzz list)
fi

# Debug assertions and overflow checks stay on (cargo-fuzz's default without -O): an overflow is a finding.
start=$(date +%s)
target_dir="$(realpath -m "${FUZZ_TARGET_DIR:-fuzz/target}")"
"${cargo_cmd[@]}" fuzz build --sanitizer "$sanitizer" --codegen-units 16 --target-dir "$target_dir"
bin_dir="$target_dir/x86_64-unknown-linux-gnu/release"
echo "built in $(($(date +%s) - start)) s"

# Targets that need files (fleet_source) make a temporary directory that libFuzzer's exit never removes:
# keep them all in one that is removed here.
export TMPDIR
TMPDIR=$(mktemp -d)
trap 'rm -rf "$TMPDIR"' EXIT

failed=()
mkdir -p fuzz/logs
for target in "${targets[@]}"; do
  corpus="fuzz/corpus/$target"
  artifacts="fuzz/artifacts/$target"
  log="fuzz/logs/$target.log"
  mkdir -p "$corpus" "$artifacts"
  before=$(find "$artifacts" -type f | sort)
  # -timeout: one input taking this long is a finding (a hang or an unbounded expansion).
  # The corpus directory comes first: libFuzzer writes new inputs there; the committed seeds are read only.
  set +e
  # Built with the network above; each target runs where only loopback exists (tests/loopback-only).
  tests/loopback-only "$bin_dir/$target" "$corpus" "fuzz/seeds/$target" \
    -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1
  status=$?
  set -e
  runs=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | tail -1 || true)
  edges=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1 || true)
  if [ "$status" -eq 0 ]; then
    echo "fuzz $target: ok (${runs:-no summary}; ${edges:-no coverage line}; corpus $(find "$corpus" -type f | wc -l) inputs)"
    continue
  fi
  failed+=("$target")
  echo "fuzz $target: FAILED (exit $status); last lines of $log:"
  tail -n 40 "$log" | sed 's/^/  | /'
  new=$(comm -13 <(echo "$before") <(find "$artifacts" -type f | sort) | sed '/^$/d')
  for artifact in $new; do
    echo "  reproducer: $artifact"
    echo "  replay it:  $bin_dir/$target $artifact"
  done
done

echo "fuzzing took $(($(date +%s) - start)) s for ${#targets[@]} targets at ${seconds} s each"
echo "fuzz: $((${#targets[@]} - ${#failed[@]})) passed, ${#failed[@]} failed"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz targets that crashed: ${failed[*]}" >&2
  exit 1
fi
