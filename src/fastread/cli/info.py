"""``fastread info``: what this installation of fastread can do here."""
import json
import os
import sys

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

    engines = {name: (True if ok is True else str(ok)) for name, ok in fastread.engines().items()}
    from fastread.engine import xnvme_version
    xver, xwhy = xnvme_version()
    devices, why = _env.cuda_devices()
    settings = {}
    for name, value in _defaults.all_settings().items():
        var = _defaults.env_var(name)
        settings[name] = {"value": value, "env": var,
                          "from_env": bool(var) and var in os.environ}
    return {
        "fastread": fastread.__version__,
        "module": os.path.dirname(fastread.__file__),
        "engines": engines,
        "packages": {label: _env.version(label) for label in _env.PACKAGES},
        # The system library behind the xNVMe engines, or why they are absent.
        "xnvme": {"version": xver, "reason": xwhy},
        "cuda_devices": devices,
        "cuda_reason": why,
        "defaults": settings,
    }


def run(args):
    from fastread.engine import RANGE_ONLY
    try:
        data = collect()
    except ValueError as e:  # a FASTREAD_* variable that does not parse
        print(f"fastread info: error: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    out = [f"fastread {data['fastread']} ({data['module']})", "", "engines:"]
    width = max(map(len, data["engines"]), default=0)
    for name, ok in data["engines"].items():
        if ok is True:
            state = "available"
        elif name in RANGE_ONLY and ok.startswith(RANGE_ONLY[name]):
            state = "available for " + ok  # "range reads only (...)"
        else:
            state = "unavailable: " + ok
        out.append(f"  {name:<{width}}  {state}")
    out += ["", "packages:"]
    width = max(max(map(len, data["packages"])), len("libxnvme"))
    for label, ver in data["packages"].items():
        out.append(f"  {label:<{width}}  {ver}")
    x = data["xnvme"]
    out.append(f"  {'libxnvme':<{width}}  "
               f"{x['version'] if x['version'] else 'unavailable: ' + x['reason']}")
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
