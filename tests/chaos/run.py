"""The chaos run: 3 brokers on a 3-member etcd cluster and MinIO under idempotent acks=all load,
and a long series of faults drawn from a seed (tests/chaos/faults.py), one at a time.

    python -m tests.chaos.run --faults 100 --seed 7      (scripts/chaos.sh wraps it)

For each fault: wait until the cluster is settled (every broker ready, every partition led, two
per broker, every broker agreeing; every etcd member and MinIO up), inject it, hold it, repair it,
then wait (bounded) until every partition acknowledged a record sent after the repair and the
cluster settled again. A fault that does not recover in time is a failure of that fault; the run
carries on (three in a row end it). A broker process found exited that the runner did not stop is
recorded and started again with the same environment: today a broker whose lease ran out (paused
past the TTL) exits 1, which is expected; after "rejoin in place" it stays up, which is fine too.

At the end: stop the load, read the topic back, run the shared history check
(tests/harness/history.py) and write tests/chaos/results/YYYY-MM-DD-HHMM.md. Exit status 0 only
if the run passed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench.run import git_commit
from tests.chaos.faults import Exit, Fault, Outcome, RunResult, render, schedule
from tests.harness.broker import BrokerFactory, BrokerProcess
from tests.harness.cluster import (
    FAST,
    PARTITIONS,
    GroupReader,
    LoadProducer,
    create_topic,
    leaders_seen_by,
    read_everything,
    start_cluster,
)
from tests.harness.etcd import EtcdCluster, EtcdServer
from tests.harness.history import History
from tests.harness.minio import MinioServer
from tests.harness.procs import HarnessError

RESULTS = Path(__file__).parent / "results"
LEASE_TTL_S = int(FAST["KAFSCALE_STORE_LOCK_TTL_MS"]) / 1000
RECOVERY_TIMEOUT_S = 120.0  # after the repair: the load acknowledged on every partition again
SETTLE_TIMEOUT_S = 180.0  # every broker ready and leading its share again
GROUP_TIMEOUT_S = 120.0  # after settling: the group read records sent after the repair
TERM_TIMEOUT_S = 90.0  # SIGTERM's hand-over waits up to 40 s for the partitions
# A broker's boot on a busy 2-core machine (the whole family, recovery of its write-ahead
# objects) can pass the harness's 75 s; a slow boot is measured, not a failed one.
BOOT_TIMEOUT_S = 180.0
BOOT_ATTEMPTS = 3
MAX_FAILURES_IN_A_ROW = 3


def log(message: str) -> None:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%H:%M:%S")
    print(f"{stamp} {message}", flush=True)


class ProgressWatch:
    """Marks moments in the load and records when every partition has ``reached`` a record sent
    after each -- acknowledged, or read by the group -- (from a thread, so a blocking call of the
    runner does not delay it)."""

    def __init__(self, load: LoadProducer, reached: Callable[[int], bool]) -> None:
        self.load = load
        self.reached = reached
        self._pending: dict[int, tuple[int, float]] = {}  # mark id -> (seq, at)
        self._done: dict[int, float] = {}
        self._lock = threading.Lock()
        self._next = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def mark(self) -> int:
        with self._lock:
            self._next += 1
            self._pending[self._next] = (self.load.sent, time.monotonic())
            return self._next

    def elapsed(self, mark: int) -> float | None:
        """Seconds from the mark until every partition acknowledged a later record, or None."""
        with self._lock:
            return self._done.get(mark)

    def wait(self, mark: int, timeout: float) -> float | None:
        deadline = time.monotonic() + timeout
        while (elapsed := self.elapsed(mark)) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return elapsed

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = time.monotonic()
            with self._lock:
                for mark, (seq, at) in list(self._pending.items()):
                    if self.reached(seq):
                        self._done[mark] = now - at
                        del self._pending[mark]


class Chaos:
    def __init__(self, args: argparse.Namespace, work_dir: Path) -> None:
        self.args = args
        self.work_dir = work_dir
        self.etcd = EtcdCluster(work_dir / "etcd", size=3)
        self.minio = MinioServer(work_dir / "minio")
        self.factory = BrokerFactory(
            work_dir / "brokers",
            f"chaos-{args.seed}",
            etcd=no_session_etcd,
            s3=lambda: self.minio,
        )
        self.brokers: list[BrokerProcess] = []
        self.history = History()
        self.load: LoadProducer | None = None
        self.watch: ProgressWatch | None = None
        self.group: GroupReader | None = None
        self.group_watch: ProgressWatch | None = None
        self.started = time.monotonic()
        self.exits: list[Exit] = []
        self.current: Fault | None = None
        self.gave_up: set[int] = set()  # pids of brokers killed after failed boots

    # --- the cluster ---------------------------------------------------------------------------

    def start(self) -> None:
        self.etcd.start_first()
        self.minio.start_first()
        env = {"KAFSCALE_ETCD_ENDPOINTS": ",".join(self.etcd.endpoints)}
        self.brokers = start_cluster(self.factory, 3, env)
        create_topic(self.brokers)
        if (problem := self.settle(time.monotonic() + SETTLE_TIMEOUT_S)) is not None:
            raise HarnessError(f"the cluster never settled: {problem}")
        self.load = LoadProducer(self.brokers, self.history, "chaos", self.args.interval)
        self.load.start()
        self.watch = ProgressWatch(self.load, self.load.acked_since)
        self.group = GroupReader(self.brokers, self.history, "chaos-group")
        self.group.start()
        self.group_watch = ProgressWatch(self.load, self.group.read_since)
        first, read = self.watch.mark(), self.group_watch.mark()
        if self.watch.wait(first, 60) is None:
            raise HarnessError("the load was never acknowledged on every partition")
        if self.group_watch.wait(read, 60) is None:
            raise HarnessError("the group never read from every partition")
        log("3 brokers, 3 etcd members, MinIO: load flowing, the group reading")

    def close(self) -> None:
        for watch in (self.watch, self.group_watch):
            if watch is not None:
                watch.stop()
        for broker in self.brokers:
            if broker.running:  # a fault interrupted while it was paused
                os.killpg(broker.pid, signal.SIGCONT)
        problems = self.factory.close()
        for problem in problems:
            log(f"teardown: {problem.splitlines()[0]}")
        self.etcd.close()
        self.minio.close()

    def restart(self, index: int) -> None:
        """Start broker ``index`` again with the environment it had (same id, ports, namespace).
        After BOOT_ATTEMPTS failed boots it raises, leaving the last one killed: `tend` tries
        again later without counting it as an exit."""
        old = self.brokers[index]
        for attempt in range(1, BOOT_ATTEMPTS + 1):
            broker = self.factory(env=dict(old.env))
            self.brokers[index] = broker
            try:
                broker.wait_ready(BOOT_TIMEOUT_S)
                return
            except HarnessError as exc:
                log(f"broker {index} did not boot (attempt {attempt}): {str(exc).splitlines()[0]}")
                broker.kill()
                if attempt == BOOT_ATTEMPTS:
                    self.gave_up.add(broker.pid)
                    raise

    def tend(self) -> None:
        """Start again every broker found exited that the runner did not stop, recording it.
        Not while MinIO is stopped: a broker refuses to start with a backend unreachable."""
        if not self.minio.running:
            return
        for index, broker in enumerate(self.brokers):
            if broker.running:
                continue
            if broker.pid in self.gave_up:  # the runner killed it after failed boots
                self.gave_up.discard(broker.pid)
                self.restart(index)
                continue
            code = broker.returncode
            problems = broker.close()  # its children must have gone with it
            fault = self.current
            expected = (
                fault is not None
                and fault.kind == "broker-pause"
                and fault.target == index
                and code == 1
                and "broker lease" in broker.log_text()
            )
            exit_ = Exit(fault.index if fault else -1, index, code, last_words(broker), expected)
            self.exits.append(exit_)
            log(f"broker {index} exited with {code} ({exit_.reason[:100]}); starting it again")
            for problem in problems:
                self.exits.append(Exit(exit_.fault_index, index, None, problem[:300], False))
            self.restart(index)

    def settle(self, deadline: float) -> str | None:
        """Wait until the cluster is whole again; None, or what was still wrong at the deadline."""
        problem: str | None = "not asked yet"
        while time.monotonic() < deadline:
            self.tend()
            problem = self._unsettled()
            if problem is None:
                return None
            time.sleep(0.5)
        return problem

    def _unsettled(self) -> str | None:
        down = [m.member_name for m in self.etcd.members if not m.running or not m.probe()]
        if down:
            return f"etcd members down: {down}"
        if not self.minio.running or not self.minio.probe():
            return "MinIO down"
        stopped = [index for index, broker in enumerate(self.brokers) if not broker.running]
        if stopped:  # asking it would wait out the client's timeout; tend() starts it again
            return f"brokers not running: {stopped}"
        try:
            seen = [leaders_seen_by(broker) for broker in self.brokers]
        except Exception as exc:  # a broker or etcd not answering yet
            return f"metadata: {exc}"
        first = seen[0]
        per_broker = Counter(leader for leader, _ in first.values())
        if len(first) != PARTITIONS or sorted(per_broker.items()) != [(0, 2), (1, 2), (2, 2)]:
            return f"leaders {first}"
        if any(other != first for other in seen[1:]):
            return f"brokers disagree: {seen}"
        return None

    # --- faults --------------------------------------------------------------------------------

    def inject(self, fault: Fault, outcome: Outcome) -> None:
        """Do the fault and repair it; returns at the repair."""
        if fault.kind == "broker-kill":
            self.brokers[fault.target].kill()
            self.restart(fault.target)
        elif fault.kind == "broker-pause":
            broker = self.brokers[fault.target]
            os.killpg(broker.pid, signal.SIGSTOP)  # the whole family (its own process group)
            try:
                time.sleep(fault.hold_s)
            finally:
                os.killpg(broker.pid, signal.SIGCONT)
        elif fault.kind == "broker-term":
            code = self.brokers[fault.target].terminate(TERM_TIMEOUT_S)
            if code != 0:
                outcome.failures.append(f"SIGTERM: exit {code}, want 0")
            for problem in self.brokers[fault.target].close():
                outcome.failures.append(problem.splitlines()[0])
            self.restart(fault.target)
        elif fault.kind == "etcd-kill":
            member = self.etcd.members[fault.target]
            with contextlib.suppress(HarnessError, OSError):
                if self.etcd.leader() is member:
                    outcome.note = f"{member.member_name} (the leader)"
            outcome.note = outcome.note or member.member_name
            member.kill()
            time.sleep(fault.hold_s)
            member.start()
        elif fault.kind == "minio-stop":
            self.minio.stop()
            time.sleep(fault.hold_s)
            self.minio.start()
        else:
            raise ValueError(fault.kind)

    def run_fault(self, fault: Fault) -> Outcome:
        assert self.watch is not None and self.load is not None
        assert self.group_watch is not None
        outcome = Outcome(fault, started_s=time.monotonic() - self.started)
        self.current = fault
        log(f"fault {fault.index}: {fault.kind} target {fault.target} hold {fault.hold_s} s")
        injected_at = time.monotonic()
        at_fault = self.watch.mark()
        try:
            self.inject(fault, outcome)
        except (HarnessError, OSError) as exc:
            outcome.failures.append(f"injecting: {str(exc).splitlines()[0]}")
        at_repair, read_at_repair = self.watch.mark(), self.group_watch.mark()
        deadline = time.monotonic() + RECOVERY_TIMEOUT_S
        while (after_repair := self.watch.elapsed(at_repair)) is None:
            if time.monotonic() > deadline:
                break
            try:
                self.tend()
            except HarnessError as exc:
                outcome.failures.append(f"a broker did not start again: {first_line(exc)}")
            time.sleep(0.1)
        outcome.after_repair_s = after_repair
        outcome.recovered_s = self.watch.elapsed(at_fault)
        if outcome.after_repair_s is None:
            outcome.failures.append(
                f"the load was not acknowledged on every partition within "
                f"{RECOVERY_TIMEOUT_S:.0f} s of the repair (last acked seq per partition "
                f"{self.load.last_acked_seq}, sent {self.load.sent})"
            )
        try:
            problem = self.settle(time.monotonic() + SETTLE_TIMEOUT_S)
        except HarnessError as exc:
            problem = f"a broker did not start again: {str(exc).splitlines()[0]}"
        outcome.longest_gap_s = self.load.outage(injected_at, list(range(PARTITIONS)))
        if problem is None:
            outcome.settled_s = time.monotonic() - injected_at
        else:
            outcome.failures.append(f"not settled within {SETTLE_TIMEOUT_S:.0f} s: {problem}")
        outcome.group_s = self.group_watch.wait(read_at_repair, GROUP_TIMEOUT_S)
        if outcome.group_s is None:
            outcome.failures.append(
                f"the group read no record sent after the repair on every partition within "
                f"{GROUP_TIMEOUT_S:.0f} s of settling (last read seq per partition "
                f"{self.group.last_read_seq if self.group else '?'})"
            )
        if self.load.fatal is not None:
            outcome.failures.append(f"the producer hit a fatal error: {self.load.fatal}")
        log(
            f"  recovered {_s(outcome.recovered_s)}, after repair {_s(outcome.after_repair_s)}, "
            f"settled {_s(outcome.settled_s)}, group {_s(outcome.group_s)}, longest gap "
            f"{_s(outcome.longest_gap_s)}; {outcome.note} "
            f"{outcome.failures or ''}"
        )
        return outcome

    def finish(self, result: RunResult) -> None:
        """Stop the load, read everything back and check the history."""
        assert self.load is not None
        self.current = None
        try:
            self.load.stop()
        except AssertionError as exc:
            result.failures.append(f"stopping the load: {exc}")
        result.sent, result.acked = self.load.sent, len(self.history.acked)
        result.delivery_errors = dict(self.load.errors)
        result.client_errors = dict(self.load.client_errors)
        if self.load.errors:
            result.failures.append(f"records the producer gave up on: {dict(self.load.errors)}")
        if self.group is not None:
            self.group.stop()
            result.group_read, result.group_errors = self.group.read, dict(self.group.errors)
        try:
            self.tend()
        except HarnessError as exc:
            result.failures.append(f"a broker did not start again: {first_line(exc)}")
        log(f"reading back {result.acked} acknowledged records")
        result.read = read_everything(
            self.brokers, self.history, result.acked, timeout=max(300, result.acked / 500)
        )
        try:
            result.check = self.history.check()
            result.check_passed = True
        except AssertionError as exc:
            result.check = f"FAILED: {exc}"
        log(f"history check: {result.check}")


def first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f} s"


def no_session_etcd() -> EtcdServer:
    raise HarnessError("the chaos run gives every broker its etcd cluster's endpoints")


def last_words(broker: BrokerProcess) -> str:
    """What the broker's last log line saying why it stopped said (or simply its last line)."""
    lines = broker.log_text().splitlines()
    line = next(
        (line for line in reversed(lines) if "stopped" in line or "critical" in line.lower()),
        lines[-1] if lines else "(empty log)",
    )
    try:
        record = json.loads(line)
    except ValueError:
        return line.strip()
    return f"{record.get('process', '?')}: {record.get('msg', line)}"


def run_faults(
    chaos: Chaos, faults: list[Fault], args: argparse.Namespace, result: RunResult
) -> None:
    in_a_row = 0
    for fault in faults:
        if args.max_minutes and time.monotonic() - chaos.started > args.max_minutes * 60:
            log(f"{args.max_minutes} minutes are up: no more faults")
            return
        outcome = chaos.run_fault(fault)
        result.outcomes.append(outcome)
        in_a_row = in_a_row + 1 if outcome.failures else 0
        if in_a_row >= MAX_FAILURES_IN_A_ROW:
            result.failures.append(f"stopped after {in_a_row} failed faults in a row")
            return
        if chaos.load is not None and chaos.load.fatal is not None:
            result.failures.append("stopped: the producer hit a fatal error")
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    parser.add_argument("--faults", type=int, default=100, help="how many faults (default 100)")
    parser.add_argument("--seed", type=int, default=None, help="default: drawn and recorded")
    parser.add_argument(
        "--interval", type=float, default=0.01, help="seconds between records sent (~100/s)"
    )
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="inject no fault after this long"
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="where the result goes")
    parser.add_argument("--keep", action="store_true", help="keep the work dir even on a pass")
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    now = datetime.datetime.now(datetime.UTC)
    faults = schedule(args.seed, args.faults, LEASE_TTL_S)
    result = RunResult(
        seed=args.seed,
        started=now.strftime("%Y-%m-%d %H:%M"),
        command=shlex.join(["python", "-m", "tests.chaos.run", *(argv or sys.argv[1:])]),
        commit=git_commit(),
        settings={
            "faults planned": str(args.faults),
            "brokers": "3 `kafscale serve` process families (1 shard each), broker lease TTL "
            f"{LEASE_TTL_S:.0f} s",
            "etcd": "3 members (one raft cluster), every broker given all three endpoints",
            "S3": "one MinIO",
            "topic": f"{PARTITIONS} partitions",
            "load": f"one idempotent acks=all confluent-kafka producer, a record every "
            f"{args.interval * 1000:.0f} ms round-robin over the partitions; one "
            "confluent-kafka consumer-group member reading along (auto commit)",
            "bounds": f"recovery {RECOVERY_TIMEOUT_S:.0f} s after the repair, a broker's boot "
            f"{BOOT_TIMEOUT_S:.0f} s (3 attempts), settling "
            f"{SETTLE_TIMEOUT_S:.0f} s, the group reading again {GROUP_TIMEOUT_S:.0f} s after "
            "that",
            "machine": f"{os.cpu_count()} cores, shared with other test runs",
        },
    )
    if args.max_minutes:
        result.settings["time limit"] = f"a time limit of {args.max_minutes:g} minutes"
    work_dir = Path(tempfile.mkdtemp(prefix="kafscale-chaos-"))
    result.work_dir = str(work_dir)
    # librdkafka logs every refused connection to stderr (a broker down is the point here):
    # keep the runner's own output readable and the clients' in a file.
    clients_log = os.open(work_dir / "clients.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    log(f"work dir {work_dir}; client logs in {work_dir / 'clients.log'}")
    os.dup2(clients_log, 2)
    chaos = Chaos(args, work_dir)
    interrupted = False
    try:
        chaos.start()
        try:
            run_faults(chaos, faults, args, result)
        except Exception as exc:  # still read everything back and check it
            result.failures.append(f"the runner failed: {type(exc).__name__}: {first_line(exc)}")
            log(result.failures[-1])
        chaos.finish(result)
    except KeyboardInterrupt:
        interrupted = True
        result.failures.append("interrupted (Ctrl-C)")
    except Exception as exc:  # the result must still be written, saying what happened
        result.failures.append(f"the runner failed: {type(exc).__name__}: {first_line(exc)}")
        log(result.failures[-1])
    finally:
        result.exits = chaos.exits
        result.duration_s = time.monotonic() - chaos.started
        chaos.close()
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{now.strftime('%Y-%m-%d-%H%M')}.md"
    path.write_text(render(result))
    log(f"{'PASS' if result.passed else 'FAIL'}: {path}")
    if result.passed and not args.keep and not interrupted:
        shutil.rmtree(work_dir, ignore_errors=True)
    else:
        log(f"logs kept in {work_dir}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
