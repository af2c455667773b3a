"""``fastread info``: what this installation of fastread can do here."""
import json
import os
import shutil
import sys
import textwrap

from fastread.bench import environment as _env


def add_parser(sub):
    p = sub.add_parser(
        "info",
        help="show version, engines, optional packages, CUDA devices and defaults",
        description="Show fastread's version, which engines run here (and why any does not), "
                    "the versions of numpy/DALI/torch/cupy, CUDA devices, and the run-time "
                    "defaults with the environment variables that override them.")
    p.add_argument("--json", action="store_true", help="print the same as one JSON object")
    p.set_defaults(run=run, _parser=p)
    return p


def collect():
    """Everything ``fastread info`` shows, as a dict."""
    import fastread
    from fastread import _defaults

    # name -> {"files": True | why not, "ranges": True | why not}
    engines = {name: st.as_dict() for name, st in fastread.engines().items()}
    from fastread.engine import auto_choice
    # What engine="auto" picks here, and the measured rule behind it (or why none).
    auto, auto_reason = auto_choice()
    from fastread.engine import xnvme_version
    xver, xwhy = xnvme_version()
    from fastread.engine import s3_version
    s3ver, s3why = s3_version()
    from fastread import _core
    cql_tls, cql_tls_why = _core.cql_tls()
    devices, why = _env.cuda_devices()
    from fastread.dali import _plugin
    # The native DALI operator (fn.fastread.readers.file): loaded, or why not.
    dali_plugin = _plugin.info()
    ray_version, ray_why = ray_data()
    parquet_version, parquet_why = parquet_support()
    parquet_native, parquet_native_why = parquet_native_route()
    from fastread.decode import choose_decoder
    # What `fastread pack --decode` decodes with by default here, and why.
    decoder = choose_decoder("auto")
    settings = {}
    for name, value in _defaults.all_settings().items():
        var = _defaults.env_var(name)
        settings[name] = {"value": value, "env": var,
                          "from_env": bool(var) and var in os.environ}
    return {
        "fastread": fastread.__version__,
        "module": os.path.dirname(fastread.__file__),
        "engines": engines,
        # What engine="auto" (or FASTREAD_ENGINE) picks here, or why none.
        "engine_auto": auto,
        "engine_auto_reason": auto_reason,
        "packages": {label: _env.version(label) for label in _env.PACKAGES},
        # The system library behind the xNVMe engines, or why they are absent.
        "xnvme": {"version": xver, "reason": xwhy},
        # The libcurl behind the s3 engine (version, TLS, features), or why it is absent.
        "s3": {"libcurl": s3ver, "reason": s3why},
        # TLS for the cql engine (Cassandra; OpenSSL at build time), or why not.
        "cql_tls": {"built": cql_tls, "reason": cql_tls_why or None},
        "dali_plugin": dali_plugin,
        # Ray Data, which fastread.ray needs (pip install fastread[ray]), or why it is absent.
        "ray": {"version": ray_version, "reason": ray_why},
        # pyarrow, which formats.Parquet decodes with (pip install fastread[parquet]), or why not.
        # ... and whether row groups are decoded through the native shim over
        # pyarrow's libparquet (values views of the engine's buffer), or why not.
        "parquet": {"pyarrow": parquet_version, "reason": parquet_why,
                    "native": parquet_native, "native_reason": parquet_native_why},
        "pack_decoder": {"auto": decoder.label, "why": decoder.why},
        "cuda_devices": devices,
        "cuda_reason": why,
        "defaults": settings,
    }


def ray_data():
    """(Ray's version, None) where Ray Data imports (fastread.ray works),
    else (None, why not)."""
    from fastread.ray import ray_reason

    why = ray_reason()
    if why is not None:
        return None, why
    import ray
    return str(getattr(ray, "__version__", "unknown version")), None


def parquet_support():
    """(pyarrow's version, None) where pyarrow.parquet imports
    (formats.Parquet works), else (None, why not)."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        return None, f"pyarrow does not import ({e}): pip install fastread[parquet]"
    return str(pyarrow.__version__), None


def parquet_native_route():
    """(True, None) where formats.Parquet decodes row groups through the
    native shim (fastread._parquet_native), else (False, why not)."""
    try:
        from fastread.formats import _parquet_native
    except ImportError as e:  # pragma: no cover - the module imports nothing optional
        return False, str(e)
    mod, why = _parquet_native.status()
    return mod is not None, why


def run(args):
    try:
        data = collect()
    except ValueError as e:  # a FASTREAD_* variable that does not parse
        print(f"fastread info: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    out = [f"fastread {data['fastread']} ({data['module']})", ""]
    out += format_engines(data)
    out += ["", "packages:"]
    width = max(max(map(len, data["packages"])), len("libxnvme"), len("DALI plugin"),
                len("libcurl (s3)"), len("TLS (cql)"), len("Ray Data"), len("Parquet"), len("pack --decode"))
    for label, ver in data["packages"].items():
        out.append(f"  {label:<{width}}  {ver}")
    x = data["xnvme"]
    out.append(f"  {'libxnvme':<{width}}  "
               f"{x['version'] if x['version'] else 'unavailable: ' + x['reason']}")
    s = data["s3"]
    out.append(f"  {'libcurl (s3)':<{width}}  "
               f"{s['libcurl'] if s['libcurl'] else 'unavailable: ' + s['reason']}")
    c = data["cql_tls"]
    out.append(f"  {'TLS (cql)':<{width}}  "
               f"{'OpenSSL (ssl=True)' if c['built'] else 'unavailable: ' + c['reason']}")
    d = data["dali_plugin"]
    out.append(f"  {'DALI plugin':<{width}}  " + (
        f"loaded: {', '.join(d['operators'])} ({d['path']}, built against DALI "
        f"{d['built_against']})" if d["loaded"] else f"unavailable: {d['reason']}"))
    r = data["ray"]
    out.append(f"  {'Ray Data':<{width}}  " + (
        f"{r['version']} (fastread.ray)" if r["version"] else f"unavailable: {r['reason']}"))
    q = data["parquet"]
    out.append(f"  {'Parquet':<{width}}  " + (
        f"pyarrow {q['pyarrow']} (formats.Parquet; "
        + ("native route: Arrow's C++ reader, views of the engine's buffers)" if q["native"]
           else f"pyarrow's reader: native route unavailable: {q['native_reason']})")
        if q["pyarrow"] else f"unavailable: {q['reason']}"))
    pd = data["pack_decoder"]
    out.append(f"  {'pack --decode':<{width}}  decoder {pd['auto']} ({pd['why']})")
    out += ["", "CUDA devices:"]
    if data["cuda_devices"]:
        out += [f"  {d}" for d in data["cuda_devices"]]
    else:
        out.append(f"  none ({data['cuda_reason']})")
    out += ["", "defaults (environment variable overrides):"]
    rows = [(name, repr(s["value"]), s["env"] + (" (set)" if s["from_env"] else ""))
            for name, s in data["defaults"].items()]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    out += [f"  {a:<{w0}}  {b:<{w1}}  {c}" for a, b, c in rows]
    print("\n".join(out))
    return 0


def format_engines(data, width=None):
    """The engines, available ones first; each unavailable engine with its
    reason, wrapped under it; engines with the same reason share one."""
    from fastread.engine import URL_ONLY

    if width is None:
        width = max(60, min(shutil.get_terminal_size((100, 24)).columns, 120))
    engines = data["engines"]
    if data.get("engine_auto"):
        head = f"engines (engine='auto' picks {data['engine_auto']}):"
    else:
        head = f"engines (engine='auto' fails: {data.get('engine_auto_reason')}):"
    out = [head]
    if data.get("engine_auto") and data.get("engine_auto_reason"):
        out += _wrapped("  auto's rule: ", data["engine_auto_reason"], width)
    name_w = max(map(len, engines), default=0)
    ok = [n for n, s in engines.items() if s["files"] is True]
    # Engines that read byte ranges (packed images) but not files.
    partial = [n for n, s in engines.items() if s["files"] is not True and s["ranges"] is True]
    # Engines that read objects at URLs (s3://), where they run: not "byte
    # ranges only" (they read whole objects too), nor unavailable.
    urls = [n for n, s in engines.items()
            if n in URL_ONLY and isinstance(s["files"], str) and s["files"].startswith(URL_ONLY[n])]
    partial = [n for n in partial if n not in urls]
    if ok:
        out.append(f"  available:    {', '.join(ok)}")
    for n in partial:
        out += _wrapped(f"  {n:<{name_w}}  ", "byte ranges only; files: " + engines[n]["files"],
                        width)
    for n in urls:
        out += _wrapped(f"  {n:<{name_w}}  ", "available for " + engines[n]["files"], width)
    groups = {}
    for n, s in engines.items():
        if s["files"] is not True and n not in partial and n not in urls:
            groups.setdefault(s["files"], []).append(n)
    if groups:
        out.append("  unavailable:")
        for reason, names in groups.items():
            label = ", ".join(names)
            out += _wrapped(f"    {label}: ", reason, width)
    return out


def _wrapped(prefix, text, width):
    indent = " " * min(len(prefix), 16)
    return textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=indent,
                         break_on_hyphens=False, break_long_words=False) or [prefix]
