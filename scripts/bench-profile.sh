#!/bin/sh
# The CPU breakdown of BENCHMARKS.md: the share of a contender's CPU
# samples whose stack holds a frame of each category, by
# `go tool pprof -top -focus=REGEXP` (a sample counts once per category;
# categories nest, see BENCHMARKS.md). Profiles come from
#   BENCH_PROFILE=/tmp/prof BENCH_ONLY='^(echo-eos|aggregate-eos-bbolt)/100ms$' make bench
# Usage: scripts/bench-profile.sh /tmp/prof/aggregate-eos-bbolt-100ms.cpu.pprof
set -eu
prof=$1
total=$(go tool pprof -top -nodecount=1 "$prof" 2>/dev/null | sed -n 's/.*Total samples = \([0-9.]*m*s\).*/\1/p')
echo "total samples: $total"
row() { # name, focus[, ignore]
	if [ -n "${3:-}" ]; then
		out=$(go tool pprof -top -nodefraction=0 -nodecount=100000 -focus="$2" -ignore="$3" "$prof" 2>/dev/null)
	else
		out=$(go tool pprof -top -nodefraction=0 -nodecount=100000 -focus="$2" "$prof" 2>/dev/null)
	fi
	printf '%-34s %s\n' "$1" "$(echo "$out" | sed -n 's/^Showing nodes accounting for \([^,]*\), \([0-9.]*%\) of.*/\1 \2/p')"
}
row "decode (fetch goroutine)"      'kgo\.\(\*source\)\.(fetch|handleReqResp)'
row "poll (PollRecords in the loop)" 'PollRecords'
row "record conversion (inputRecord)" '\(\*task\)\.inputRecord'
row "job (Process, less state/emit)" '(AggregateWith|EchoWith)\.func' 'kstate\.|recordContext\)\.Emit'
row "state read (ValueState.Get)"   'kstate\.\(\*ValueState.*\)\.Get'
row "  of which bbolt reads"        'kstate\.\(\*boltBackend\)\.Get'
row "write-set (Set, CommitRecord)" 'kstate\.\(\*ValueState.*\)\.Set|kstate\.\(\*Store\)\.CommitRecord'
row "emit + produceFor (buffering)" 'recordContext\)\.Emit|\(\*loop\)\.produceFor'
row "  of which kgo record buffering"    'kgo\.\(\*Client\)\.(doPartition|loadPartsAndPartition)'
row "changelog (task.preCommit)"    '\(\*task\)\.preCommit|sluice/changelog\.'
row "produce requests (kgo sinks)"  'kgo\.\(\*broker\)\.handleReqs|kgo\.\(\*sink\)\.'
row "bbolt apply (Backend.Apply)"   'kstate\.\(\*boltBackend\)\.Apply$'
row "commit (loop.commit, on CPU)"  '\(\*loop\)\.commit$'
row "GC background marking"         'runtime\.gcBgMarkWorker'
row "malloc (everywhere)"           'runtime\.mallocgc$'
row "the loop (iterate), all"       '\(\*loop\)\.iterate'
