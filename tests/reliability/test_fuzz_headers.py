"""Seeded fuzzing of the safetensors and GGUF header readers (and config.json), in a watched child.

CI runs HEARTH_FUZZ_EXAMPLES (default 1000) examples per target; the long run is
`HEARTH_FUZZ_EXAMPLES=20000 pytest tests/reliability/test_fuzz_headers.py -s`. Targets 0 untyped
exceptions, 0 crashes, 0 hangs; the figure is printed.
"""
from __future__ import annotations

import reliability_corpus as corpus
from reliability_harness import python, run_watched

TARGETS = ["safetensors-bytes", "safetensors-json", "config-json", "gguf-bytes", "gguf-fields"]
TARGET_TIMEOUT_S = 1800     # the watchdog of a whole target; an example's own is HEARTH_FUZZ_HANG_S


def test_header_readers_survive_fuzzing(tmp_path):
    corpus.write_bases(tmp_path / "bases")
    results = run_watched([python(), "tests/reliability/fuzz_worker.py", str(tmp_path / "bases"),
                           str(tmp_path / "work")], TARGETS, TARGET_TIMEOUT_S)
    lines, failures = [], []
    for target in TARGETS:
        r = results[target]
        if "tried" not in r:
            failures.append(f"{target}: {r}")
            continue
        lines.append(f"{target}: {r['tried']} inputs, {r['typed']} refused with a typed error, "
                     f"{r['untyped']} untyped exceptions")
        if r["untyped"]:
            failures.append(f"{target}: {r['places']}")
    tried = sum(r.get("tried", 0) for r in results.values())
    hangs = sum(1 for r in results.values() if r.get("hang"))
    crashes = sum(1 for r in results.values() if "crash" in r)
    print(f"\nfuzzing: {tried} inputs, {sum(r.get('untyped', 0) for r in results.values())} untyped exceptions, "
          f"{crashes} crashes, {hangs} hangs\n  " + "\n  ".join(lines))
    assert not failures, failures
    assert tried >= 1000
