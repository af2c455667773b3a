"""The interleaved-rounds scripts' shared pieces (bench/dali/bench_native.py,
bench/dali/bench_image.py, bench/dali/wds_native.py): their common arguments,
``--modes`` with operator arguments, warming the page cache, the rounds
(every mode once per round, so a noisy machine hurts every mode alike) and
the report of medians, ratios to a base mode and paired per-round ratios.

Each script keeps what is its own: its modes and how it builds a pipeline
for one, and its report's header line. Nothing heavy is imported here; the
rounds time a built pipeline with :func:`~fastread.bench.runners.time_pipeline`.
"""
import statistics
import sys

from fastread.bench.runners import time_pipeline


def add_common_arguments(ap, *, modes, warmup=3):
    """The options every interleaved script takes; `modes` is --modes'
    default, `warmup` --warmup's."""
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--prefetch-queue-depth", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=warmup)
    ap.add_argument("--modes", default=modes)
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                    help="gpu: a pipeline on GPU 0, host outputs moved there with .gpu()")
    ap.add_argument("--decode", action="store_true",
                    help="decode the JPEGs (mixed on --device gpu, else CPU); outputs shapes")


def build_pipeline(read, *, batch, threads, depth, gpu, decode, shapes_only=False):
    """A built DALI pipeline (on GPU 0 where `gpu`) around read(), which
    defines the reader and returns its (data, labels). With `decode` the data
    are decoded (DALI's mixed decoder, nvJPEG, on the GPU, else its CPU
    decoder) and the outputs are the images' shapes; otherwise the data,
    moved to the GPU with .gpu() where the pipeline has one and the reader
    gave host data (as a user writes it), or with `shapes_only` only their
    shapes (the bytes stay inside the pipeline, as when a decoder consumes
    them; as outputs DALI makes them contiguous, a copy of every byte for a
    reader whose samples are separate views)."""
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=0 if gpu else None,
                  prefetch_queue_depth=depth)
    def pipe():
        data, labels = read()
        if decode:
            return fn.decoders.image(data, device="mixed" if gpu else "cpu").shape(), labels
        if gpu and data.device != "gpu":
            data = data.gpu()
        return (data.shape(), labels) if shapes_only else (data, labels)

    p = pipe()
    p.build()
    return p


def _value(text):
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return int(text) if text.lstrip("-").isdigit() else text


def parse_modes(text, known=None):
    """Modes separated by commas, each of which may carry keyword arguments
    after a colon, joined by `+`: ``native:threads=2+o_direct=true``.
    [(label as written, mode name, {keyword: value})]; values are booleans
    (true/false), integers or strings. With `known`, a mode name outside it
    exits naming it and the known ones."""
    modes = []
    for item in text.split(","):
        name, _, args = item.partition(":")
        kw = {}
        for pair in filter(None, args.split("+")):
            key, _, value = pair.partition("=")
            kw[key] = _value(value)
        modes.append((item, name, kw))
    if known is not None:
        unknown = sorted({name for _, name, _ in modes} - set(known))
        if unknown:
            sys.exit(f"unknown modes {', '.join(unknown)}; known: {', '.join(known)}")
    return modes


def warm_page_cache(paths):
    """Reads every file once, in 16 MiB pieces, so that the page cache holds
    it (the scripts measure warm reads)."""
    for path in paths:
        with open(path, "rb") as f:
            while f.read(16 << 20):
                pass


def run_rounds(modes, build, *, rounds, warmup, batches, width=16):
    """`rounds` rounds, each building every mode's pipeline in order with
    ``build(mode name, keyword arguments)``, timing `warmup` untimed and then
    `batches` timed batches, and dropping it before the next mode builds
    (one pipeline's threads and memory at a time). Prints a line a
    measurement; ({label: [img/s a round]}, {label: [CPU-us/img a round]})."""
    rates = {label: [] for label, _, _ in modes}
    cpu = {label: [] for label, _, _ in modes}
    for r in range(rounds):
        for label, name, kw in modes:
            pipe = build(name, kw)
            rate, cpu_us = time_pipeline(pipe, warmup, batches)
            del pipe
            rates[label].append(rate)
            cpu[label].append(cpu_us)
            print(f"round {r + 1} {label:{width}s} {rate:10,.0f} img/s  {cpu_us:7.1f} CPU-us/img",
                  flush=True)
    return rates, cpu


def report_rows(rates, cpu, *, base=None, ceiling=None, width=16):
    """A line a mode: its median img/s; with `base` (a label), the ratio of
    medians to the base's and the median of its per-round ratios (paired:
    each round against the base run next to it in time, steadier on a shared
    machine); with `ceiling` (a label), its median as a percentage of the
    ceiling's; its median CPU-us/img (with `base`, the base's over its own);
    its runs and their spread (population standard deviation / median)."""
    base_rate = statistics.median(rates[base]) if base in rates else None
    base_cpu = statistics.median(cpu[base]) if base in cpu else None
    top = statistics.median(rates[ceiling]) if ceiling in rates else None
    lines = []
    for label, runs in rates.items():
        med = statistics.median(runs)
        med_cpu = statistics.median(cpu[label])
        ratios = ""
        if base_rate:
            paired = statistics.median(x / y for x, y in zip(runs, rates[base]))
            ratios = f"{med / base_rate:5.2f}x (paired {paired:5.2f}x)"
        if top:
            ratios += f" {med / top * 100:5.1f}%"
        cpu_ratio = f" ({base_cpu / med_cpu:4.2f}x)" if base_cpu and med_cpu else ""
        spread = statistics.pstdev(runs) / med * 100 if med else 0.0
        lines.append(f"{label:{width}s} {med:10,.0f} img/s  {ratios}  {med_cpu:7.1f} CPU-us/img"
                     f"{cpu_ratio}  (runs: {', '.join(f'{x:,.0f}' for x in runs)}; "
                     f"spread {spread:.0f}%)")
    return lines


def print_report(header, rates, cpu, **kw):
    """A blank line, the script's `header` (what was run, and what the ratios
    are to), then :func:`report_rows`."""
    print(f"\n{header}")
    for line in report_rows(rates, cpu, **kw):
        print(line)
