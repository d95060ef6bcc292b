"""The JSON log lines: every configured credential is masked, wherever it appears."""

import json
import logging
import subprocess
import sys
import textwrap

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
