"""Malformed checkpoints: every case of the corpus through inspect, import and load (torch backend).

Each case runs in a watched child process (tests/reliability/reliability_harness.py), so a hang or a
crash is counted, not suffered. The figure (cases, clear errors, crashes, hangs) is printed; run
`pytest tests/reliability/test_malformed_checkpoints.py -s` to see it.
"""
from __future__ import annotations

import pytest

import reliability_corpus as corpus
from reliability_harness import python, run_watched

CASE_TIMEOUT_S = 300      # a watchdog for a hung case on a busy machine, never a speed bound


@pytest.fixture(scope="module")
def corpus_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    corpus.write_bases(root / "bases")
    names = [c.name for c in corpus.cases()]
    worker = ["tests/reliability/corpus_worker.py"]
    return run_watched([python(), *worker, str(root / "bases"), str(root / "work")], names, CASE_TIMEOUT_S)


def _clear(stage: dict) -> bool:
    message = stage.get("message", "")
    return (stage["outcome"] == "typed" and 10 < len(message) < 700 and "Traceback" not in message
            and "\n  File " not in message)


def test_corpus_is_large_and_varied():
    cases = corpus.cases()
    assert len(cases) >= 100
    assert len({c.name for c in cases}) == len(cases)
    families = {c.name.split("-")[0] for c in cases}
    assert families == {"st", "gguf"}
    assert sum(c.base == "gguf" for c in cases) >= 50


def test_every_malformed_checkpoint_is_a_clear_error(corpus_results):
    cases = corpus.by_name()
    hangs = sorted(n for n, r in corpus_results.items() if r.get("hang"))
    crashes = sorted(n for n, r in corpus_results.items() if "crash" in r)
    untyped = sorted(f"{n} at {s}: {r[s]['error']}: {r[s]['message'][:120]}" for n, r in corpus_results.items()
                     if "inspect" in r for s in ("inspect", "import", "load") if r[s]["outcome"] == "untyped")
    unclear = sorted(f"{n} at {s}: {r[s].get('message', '')[:120]!r}" for n, r in corpus_results.items()
                     if "inspect" in r for s in ("inspect", "import", "load")
                     if r[s]["outcome"] == "typed" and not _clear(r[s]))
    accepted = sorted(n for n, r in corpus_results.items() if "inspect" in r and cases[n].must_fail
                      and not any(r[s]["outcome"] == "typed" for s in ("inspect", "import", "load")))
    dirty = sorted(n for n, r in corpus_results.items() if "inspect" in r and not r["library_clean"])
    leaked = sorted(n for n, r in corpus_results.items() if r.get("leaked"))
    clear = sum(1 for n, r in corpus_results.items() if "inspect" in r and cases[n].must_fail
                and any(_clear(r[s]) for s in ("inspect", "import", "load")))
    print(f"\nmalformed checkpoints: {len(corpus_results)} cases ({sum(c.must_fail for c in cases.values())} "
          f"must fail), {clear} refused with a clear error, {len(untyped)} untyped exceptions, "
          f"{len(crashes)} crashes, {len(hangs)} hangs, {len(dirty)} left the library unclean, "
          f"{len(leaked)} sandbox leaks")
    assert not hangs, hangs
    assert not crashes, {n: corpus_results[n] for n in crashes}
    assert not untyped, untyped
    assert not unclear, unclear
    assert not accepted, accepted
    assert not dirty, dirty
    assert not leaked, leaked


def test_valid_bases_load_and_chat(corpus_results):
    for name in ("st-base", "st-sharded-base", "gguf-base"):
        r = corpus_results[name]
        assert [r[s]["outcome"] for s in ("inspect", "import", "load")] == ["ok", "ok", "ok"], r
        assert r["library_clean"]
