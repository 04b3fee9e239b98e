"""A worker process for tests/test_fuzz.py: runs ``placement`` command lines in-process, one per
line of JSON on stdin, and answers each with one line of JSON on stdout.

Request: ``{"argv": [...], "stdin": str | null}``. Answer: ``{"code": int | null, "out": str,
"err": str, "traceback": str | null, "seconds": float}``; ``traceback`` is set when the command
raised instead of returning an exit status (a crash). The parent kills the worker when an
answer does not come in time (a hang) and starts a new one.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
import traceback


def main() -> None:
    from placement_logic.cli import main as placement

    requests, answers = sys.stdin, sys.stdout
    for line in requests:
        req = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        sys.stdin = io.StringIO(req.get("stdin") or "")
        start = time.perf_counter()
        code, tb = None, None
        try:  # anything written to the process's own streams goes to the answer, not the channel
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = placement(req["argv"], out, err)
        except SystemExit as exc:  # argparse's own exits (--help, usage errors) are exit statuses
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BaseException:  # noqa: BLE001 - a crash is what the fuzz test looks for
            tb = traceback.format_exc()
        finally:
            sys.stdin = requests
        answers.write(json.dumps({"code": code, "out": out.getvalue(), "err": err.getvalue(), "traceback": tb,
                                  "seconds": time.perf_counter() - start}) + "\n")
        answers.flush()


if __name__ == "__main__":
    main()
