"""One measurement in a fresh Python process: startup, memory and first-batch
figures mean nothing in a process that already holds the previous row's
pages. The child prints one JSON object as its last line of output."""
import json
import subprocess
import sys


def run_child(code, *args, timeout=None):
    """Runs ``python -c code args...``: its last stdout line parsed as JSON, or
    ``{"error": ...}`` (its last stderr line, or the timeout)."""
    try:
        out = subprocess.run([sys.executable, "-c", code, *map(str, args)],
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s (stopped)"}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])
