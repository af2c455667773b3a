"""What ``fastread bench`` prints and draws: the table, the verdict, the plot."""


def _mb(v):
    return "n/a" if v is None else f"{v / 2**20:.1f}"


def baseline_of(results):
    """The first baseline result (fn.readers.file, fn.readers.numpy), or None."""
    return next((r for r in results if r.get("role") == "baseline"), None)


def spread(r):
    """(min, max) img/s over the runs of a result."""
    vals = [x["img_per_s"] for x in r["runs"]]
    return min(vals), max(vals)


def format_table(results, rss=False):
    """One row per result: img/s and GB/s of the median run, its share of the
    baseline and of the disk's ceiling (a ceiling mode), the runs' spread,
    and what ran."""
    base = baseline_of(results)
    ceiling = max((r["gb_per_s"] for r in results if r.get("role") == "reference"
                   and (r.get("ceiling") or r["mode"].startswith("ceiling-"))), default=None)
    # Shown where some mode reports them (the s3 family's context counters).
    inflight = any((r.get("stats") or {}).get("s3_inflight_max") is not None for r in results)
    cpu = any(r.get("cpu_s_per_gb") is not None for r in results)
    repeated = any(len(r["runs"]) > 1 for r in results)
    head = ["mode", "img/s", "GB/s", "batches", "seconds"]
    if repeated:
        head.append("spread")
    if base:
        head.append(f"vs {base['mode']}")
    if ceiling:
        head.append("of ceiling")
    if rss:
        head += ["max RSS MiB", "RSS growth MiB"]
    if cpu:
        head.append("CPU s/GB")
    if inflight:
        head.append("in flight")
    head.append("what ran")
    rows = []
    for r in results:
        row = [r["mode"], f"{r['img_per_s']:,.0f}", f"{r['gb_per_s']:.3f}", str(r["batches"]),
               f"{r['seconds']:.3f}"]
        if repeated:
            lo, hi = spread(r)
            row.append(f"±{50 * (hi - lo) / r['img_per_s']:.0f}%" if r["img_per_s"] else "n/a")
        if base:
            row.append(f"{r['img_per_s'] / base['img_per_s']:.2f}x")
        if ceiling:
            row.append(f"{100 * r['gb_per_s'] / ceiling:.0f}%")
        if rss:
            row += [_mb(r.get("rss_max")), _mb(r.get("rss_growth"))]
        if cpu:
            v = r.get("cpu_s_per_gb")
            row.append("n/a" if v is None else f"{v:.2f}")
        if inflight:
            v = (r.get("stats") or {}).get("s3_inflight_max")
            row.append("n/a" if v is None else str(v))
        row.append(r.get("what") or "")
        rows.append(row)
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    last = len(head) - 1

    def line(cells):
        return "  ".join(c.ljust(w) if i in (0, last) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), rule] + [line(r) for r in rows])


def _ratio(r, base):
    return r["img_per_s"] / base["img_per_s"]


def _overlap(a, b):
    (alo, ahi), (blo, bhi) = spread(a), spread(b)
    return len(a["runs"]) > 1 and len(b["runs"]) > 1 and alo <= bhi and blo <= ahi


def verdict(results, where):
    """One line: fastread's fastest DALI mode against the baseline, the
    fastest fastread mode without DALI, and the plain-Python way. ``where``
    says which machine, device and cache the results are from."""
    base = baseline_of(results)
    if base is None:
        return f"verdict ({where}): no baseline ran (dali / numpy-dali), nothing to compare with"
    fast = [r for r in results if r.get("role") == "fastread"]
    in_dali = max((r for r in fast if r.get("dali")), key=lambda r: r["img_per_s"], default=None)
    direct = max((r for r in fast if not r.get("dali")), key=lambda r: r["img_per_s"],
                 default=None)
    # The plain-Python way inside DALI (the seed's external source) if it ran.
    pys = [r for r in results if r.get("role") == "python"]
    python = max([r for r in pys if r.get("dali")] or pys, key=lambda r: r["img_per_s"],
                 default=None)
    parts = []
    if in_dali:
        noise = " (within run-to-run spread)" if _overlap(in_dali, base) else ""
        parts.append(f"fastread in DALI ({in_dali['mode']}) reads {_ratio(in_dali, base):.2f}x "
                     f"as fast as {base['what']} ({in_dali['img_per_s']:,.0f} vs "
                     f"{base['img_per_s']:,.0f} img/s){noise}")
    if direct:
        parts.append(f"without DALI ({direct['mode']}) {_ratio(direct, base):.2f}x")
    if python:
        parts.append(f"the plain Python way ({python['mode']}) {_ratio(python, base):.2f}x")
    if not parts:
        return f"verdict ({where}): only the baseline ran"
    return f"verdict ({where}): " + "; ".join(parts)


_COLOURS = {"fastread": "#76b900", "baseline": "#4c72b0", "python": "#999999",
            "reference": "#dd8452"}


def write_plot(path, results, title):
    """Bars of img/s per mode (median run, whiskers from the slowest to the
    fastest run); warm and cold side by side when both ran."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["mode"] for r in results))
    caches = list(dict.fromkeys(r.get("cache", "warm") for r in results))
    width = 0.8 / len(caches)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(names) * len(caches) ** 0.5 + 2), 4.8))
    for k, cache in enumerate(caches):
        xs, vals, lo, hi, colours = [], [], [], [], []
        for i, name in enumerate(names):
            r = next((r for r in results if r["mode"] == name
                      and r.get("cache", "warm") == cache), None)
            if r is None:
                continue
            mn, mx = spread(r)
            xs.append(i + (k - (len(caches) - 1) / 2) * width)
            vals.append(r["img_per_s"])
            lo.append(r["img_per_s"] - mn)
            hi.append(mx - r["img_per_s"])
            colours.append(_COLOURS.get(r.get("role"), "#999999"))
        bars = ax.bar(xs, vals, width=width * 0.95, color=colours,
                      hatch="//" if cache == "cold" else None, edgecolor="white",
                      yerr=[lo, hi] if any(lo) or any(hi) else None, capsize=3,
                      label=f"{cache} cache" if len(caches) > 1 else None)
        for b, v, h in zip(bars, vals, hi):
            ax.annotate(f"{v:,.0f}", (b.get_x() + b.get_width() / 2, v + h),
                        ha="center", va="bottom", fontsize=7, xytext=(0, 2),
                        textcoords="offset points")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=30, ha="right")
    ax.set_ylabel("images / s")
    ax.set_title(title, fontsize=9)
    if len(caches) > 1:
        ax.legend(fontsize=8)
    ax.margins(y=0.12)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
