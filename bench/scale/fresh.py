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


def print_build_rows(rows, what, first):
    """The markdown table of pipeline-build rows (build_s, build_rss,
    first_batch_s, first_batch_rss, peak_rss; or error), then the load."""
    print(f"\n| N | {what} | pipeline built s | RSS then MB | {first} "
          "| RSS then MB | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['n']:,} | {r['mode']} | {r['error']} |  |  |  |  |")
            continue
        print(f"| {r['n']:,} | {r['mode']} | {r['build_s']:.3f} | {r['build_rss'] / 2**20:,.0f} "
              f"| {r['first_batch_s']:.3f} | {r['first_batch_rss'] / 2**20:,.0f} | "
              f"{r['peak_rss'] / 2**20:,.0f} |")
    print(f"load average: {open('/proc/loadavg').read().split()[:3]}")
