"""The fuzz target in CI: mutated real-client frames and record batches (``fuzz.py`` here), a
fixed seed, run in a child process whose address space is capped, so an allocation past the
bound fails there -- or aborts it, as kio's native reader did on the 25-byte Metadata v12 --
instead of taking the test run down."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from tests.unit.protocol import fuzz

ROOT = Path(__file__).resolve().parents[3]
ADDRESS_SPACE = 3 << 30  # the interpreter, kio and the corpus need ~1 GiB of it; a bomb needs 34


def run_fuzzer(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.unit.protocol.fuzz", f"--rlimit-as={ADDRESS_SPACE}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "RUST_BACKTRACE": "0"},
    )


def test_mutated_frames_decode_or_raise_the_decode_error_within_the_memory_bound() -> None:
    done = run_fuzzer("--seed=14", "--requests=100000", "--batches=15000")
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    report = json.loads(done.stdout)
    assert report["failures"] == []
    assert report["requests"] == 100_000 and report["batches"] == 15_000
    outcomes = report["outcomes"]
    # The mutations reach past the first check: many frames still decode, batches still pass.
    assert outcomes["decoded"] > 10_000 and outcomes["MalformedRequest"] > 10_000
    assert outcomes["batch ok"] > 50 and outcomes["batch refused"] > 5_000


def test_the_corpus_holds_every_client_and_decodes_unmutated() -> None:
    lines = fuzz.CORPUS.read_text().split("\n")
    clients = {line.split()[0] for line in lines if line}
    assert clients == {"aiokafka", "confluent-kafka", "java", "kafka-python", "kcat"}
    for frame in fuzz.load_corpus():
        fuzz.decode_request(frame)  # raises if a real client's request does not decode


def test_a_target_that_raises_anything_else_is_reported() -> None:
    corpus = fuzz.load_corpus()[:20]
    summary = fuzz.Summary()
    original = fuzz.decode_request
    try:
        fuzz.decode_request = lambda frame: {}["missing"]  # type: ignore[assignment]
        fuzz.fuzz_requests(random.Random(1), corpus, 5, summary)
    finally:
        fuzz.decode_request = original
    assert len(summary.failures) == 5
    assert summary.failures[0].startswith("request KeyError('missing')")


def test_the_same_seed_gives_the_same_run() -> None:
    corpus = fuzz.load_corpus()
    first = list(fuzz.mutated_requests(random.Random(7), corpus, 2000))
    assert first == list(fuzz.mutated_requests(random.Random(7), corpus, 2000))
    assert first != list(fuzz.mutated_requests(random.Random(8), corpus, 2000))
    assert len(set(first)) > 1900
