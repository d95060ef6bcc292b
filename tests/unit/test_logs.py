"""The JSON log lines: every configured credential is masked, wherever it appears."""

import json
import logging
import signal
import subprocess
import sys
import textwrap
import time

from botocore.exceptions import ClientError

from kafscale.logs import JsonFormatter

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = 'wJalrXUtnFEMI/K7MDENG/bPxRfi"CYEXAMPLEKEY\\'  # a quote and a backslash: escaped


def record(message: str, *args: object, **fields: object) -> logging.LogRecord:
    entry = logging.LogRecord("kafscale.test", logging.ERROR, __file__, 1, message, args, None)
    entry.__dict__.update(fields)
    return entry


def test_credentials_are_masked_in_messages_fields_and_exceptions() -> None:
    formatter = JsonFormatter("shard-0", [ACCESS_KEY, SECRET_KEY])
    error = ClientError(
        {"Error": {"Code": "InvalidAccessKeyId", "Message": f"no such key {ACCESS_KEY}"}},
        "PutObject",
    )
    try:
        raise error
    except ClientError:
        entry = record("upload failed with %s", SECRET_KEY, key={"id": ACCESS_KEY})
        entry.exc_info = sys.exc_info()
    line = formatter.format(entry)
    assert ACCESS_KEY not in line
    assert json.dumps(SECRET_KEY)[1:-1] not in line and "CYEXAMPLEKEY" not in line
    parsed = json.loads(line)  # still one valid JSON object
    assert parsed["msg"] == "upload failed with ***"
    assert parsed["key"] == {"id": "***"}
    assert "InvalidAccessKeyId" in parsed["exception"] and "no such key ***" in parsed["exception"]


def test_a_longer_credential_holding_a_shorter_one_is_masked_whole() -> None:
    line = JsonFormatter("supervisor", ["abcd", "abcdefgh"]).format(record("x abcdefgh y"))
    assert json.loads(line)["msg"] == "x *** y"


def test_values_too_short_to_tell_from_text_are_left_alone() -> None:
    line = JsonFormatter("supervisor", ["k", ""]).format(record("kafscale broker"))
    assert json.loads(line)["msg"] == "kafscale broker"


def test_uncaught_exceptions_are_masked_json_lines() -> None:
    script = textwrap.dedent(
        f"""
        import threading
        from kafscale import logs
        logs.setup("frontend-0", "info", [{ACCESS_KEY!r}])

        def fail():
            raise RuntimeError("signature of {ACCESS_KEY} does not match")

        thread = threading.Thread(target=fail, name="uploader")
        thread.start()
        thread.join()
        fail()
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert ACCESS_KEY not in result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(line["level"], line["msg"]) for line in lines] == [
        ("error", "uncaught exception in a thread"),
        ("critical", "uncaught exception"),
    ]
    assert lines[0]["thread_name"] == "uploader"
    assert all("signature of *** does not match" in line["exception"] for line in lines)


def test_sigquit_writes_every_threads_stack_and_the_process_goes_on() -> None:
    script = textwrap.dedent(
        """
        import sys, threading, time
        from kafscale import logs
        logs.setup("coordinator-0", "info")

        def stuck_in_a_call():
            time.sleep(60)

        threading.Thread(target=stuck_in_a_call, name="keeper", daemon=True).start()
        print("ready", flush=True)
        sys.stdin.readline()  # the main thread waits here until the test says go on
        print("still running", flush=True)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGQUIT)
        time.sleep(0.5)  # time to write the dump; the process must be there after it
        proc.stdin.write("go on\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0 and out == "still running\n"
    assert "most recent call first" in err
    assert "stuck_in_a_call" in err  # the other thread's stack, not only the main one's
    assert "<module>" in err
