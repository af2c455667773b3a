"""The 64 KiB cut, deterministically: a child (PYTHONUNBUFFERED=1 or not)
does MODE, then prints an 86,404-byte line into a pipe that the parent
starts reading only 0.3 s later, so the write blocks on the full pipe while
whatever MODE left behind runs. Prints the bytes the parent got, 6 runs per
case (86404 whole; 65537 = the pipe's 64 KiB + the separate "\\n" write).

MODE: none; psync / io_uring (open_context, close); io_uring-reader (a
Reader over a 20-file tree); probe (fastread.engines()); probe-sleep and
ctx-sleep (the same, then 0.3 s of sleep before the print).
Usage: MODES="probe io_uring" python3 uring_cut.py"""
import os, subprocess, sys, time
child = r'''
import os, sys, fastread
paths = sys.argv[1:]
mode = os.environ["MODE"]
if mode == "io_uring-reader":
    with fastread.Reader(os.path.dirname(os.path.dirname(paths[0])), batch_size=64, engine="io_uring", workers=2) as r:
        for _ in r: pass
elif mode == "probe":
    fastread.engines()
elif mode == "probe-sleep":
    fastread.engines(); import time; time.sleep(0.3)
elif mode == "ctx-sleep":
    ctx = fastread.open_context("io_uring"); ctx.close(); import time; time.sleep(0.3)
elif mode in ("io_uring", "psync"):
    ctx = fastread.open_context(mode)
    ctx.close()
sys.stderr.write("ready\n"); sys.stderr.flush()
print("x" * 86403)
'''
root = os.path.join(os.environ.get("TMPDIR", "/tmp"), "fdaudit-cut-tree", "c0")
os.makedirs(root, exist_ok=True)
paths = []
for j in range(20):
    p = f"{root}/{j}.jpg"; open(p, "wb").write(b"y" * (j + 1)); paths.append(p)
for mode in os.environ.get("MODES", "none psync io_uring ctx-sleep probe probe-sleep io_uring-reader").split():
    for unbuf in ("1", None):
        env = dict(os.environ, MODE=mode)
        if unbuf is None:
            env.pop("PYTHONUNBUFFERED", None)
        else:
            env["PYTHONUNBUFFERED"] = unbuf
        res = []
        for i in range(6):
            p = subprocess.Popen([sys.executable, "-c", child] + paths, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, env=env)
            p.stderr.readline()
            time.sleep(0.3)   # the child is now blocked writing into a full pipe
            out = p.stdout.read(); p.wait()
            res.append(len(out))
        print(f"{mode:16s} PYTHONUNBUFFERED={unbuf}: stdout bytes {res}", flush=True)
