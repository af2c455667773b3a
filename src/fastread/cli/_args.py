"""argparse value types shared by the subcommands."""
import argparse
import math


def positive_int(text):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def nonnegative_int(text):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


_TRUE = {"true", "yes", "on"}
_FALSE = {"false", "no", "off"}


def key_value(text):
    """``k=v`` -> (k, v) with v parsed as int (0x.. too), bool or str."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    raw = raw.strip()
    low = raw.lower()
    if low in _TRUE:
        return key, True
    if low in _FALSE:
        return key, False
    try:
        return key, int(raw, 0)
    except ValueError:
        return key, raw
