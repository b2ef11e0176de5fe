#!/usr/bin/env bash
# Build agentdiff and run it once on a fresh demo folder with the built-in defaults
# (local backend, built-in policy): a command that edits, creates and deletes files and
# writes a protected `.env`. Prints the run summary, verifies the run, previews the rollback
# (the `.env` diff shows sizes and hashes only), then really rolls it back and lists the folder.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cargo build --release --quiet --manifest-path "$repo/Cargo.toml" -p agentdiff
bin="$repo/target/release/agentdiff"

demo=${1:-$(mktemp -d "${TMPDIR:-/tmp}/agentdiff-demo.XXXXXX")}
mkdir -p "$demo/src"
cd "$demo"
printf 'first line\n' > a.txt
printf 'to be deleted\n' > c.txt
printf 'fn main() {}\n' > src/main.rs

echo "demo folder: $demo"
set +e
# The run's id is chosen here (--run-id), so nothing has to be parsed out of agentdiff's output.
run="demo-$(date -u +%Y%m%dT%H%M%S)-$$"
"$bin" run --run-id "$run" --task "demo edit" -- sh -c 'echo x >> a.txt; echo y > b.txt; rm c.txt; echo TOKEN=1 > .env'
code=$?
set -e
echo "agentdiff run exited $code (71 = denied findings under the default --fail-on deny)"
"$bin" verify "$run"
"$bin" rollback "$run" --all --dry-run
"$bin" rollback "$run" --all
echo "after rollback:"
ls -A "$demo" | grep -v '^\.agentdiff$'
