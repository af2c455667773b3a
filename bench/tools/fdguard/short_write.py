"""CPython 3.11 with PYTHONUNBUFFERED=1 drops the rest of a print() whose
write into a full pipe returns short (a signal, or task work queued with
TWA_SIGNAL, ends the blocked write after the pipe's 64 KiB): each child
writes 86,404 bytes, gets SIGUSR1 (a no-op handler) while blocked; the
parent prints (rc, bytes it got, the child's note) for 3 runs.
Usage: python3 short_write.py (run with and without PYTHONUNBUFFERED=1)"""
import os, signal, subprocess, sys, time
childs = {
 "print": 'print("x" * 86403)',
 "buffer.write": 'sys.stdout.buffer.write(b"x" * 86403 + b"\\n"); sys.stdout.buffer.flush()',
 "os.write-once": 'n = os.write(1, b"x" * 86403 + b"\\n"); sys.stderr.write(f"wrote {n}\\n")',
 "fileio.write": 'import io; f = io.FileIO(1, "w", closefd=False); n = f.write(b"x" * 86404); sys.stderr.write(f"fileio wrote {n}\\n")',
}
for name, body in childs.items():
    child = "import signal, sys, os\nsignal.signal(signal.SIGUSR1, lambda *a: None)\nsys.stderr.write('ready\\n'); sys.stderr.flush()\n" + body + "\n"
    res = []
    for i in range(3):
        p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        p.stderr.readline()
        time.sleep(0.2)
        os.kill(p.pid, signal.SIGUSR1)
        time.sleep(0.1)
        out = p.stdout.read()
        err = p.stderr.read().decode().strip().replace("\n", " | ")[-120:]
        p.wait()
        res.append((p.returncode, len(out), err))
    print(name, res)
