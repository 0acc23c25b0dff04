"""The argument checks the package's public functions share. Each takes the argument's name as the user
wrote it and returns the value in the type the C++ side takes (a float, an int, a str), or raises
ValueError "<name>: expected <what>, found <the value>": a bad value is refused where it is given, by
name, never cast silently (bool("false") is True) nor left for nanobind's "incompatible function
arguments" or a std::bad_cast at the first call.

numpy's scalars are numbers here (numbers.Real, numbers.Integral); a bool is not a number.
"""

import math
import numbers
import operator
import os

INT32_MIN, INT32_MAX = -2 ** 31, 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1
UINT64_MAX = 2 ** 64 - 1
F32_MAX = 3.4028234663852886e38  # the largest finite f32: a float argument the C++ side takes as f32

# Bounds written as people read them.
_BOUND_TEXT = {INT32_MIN: "-2**31", INT32_MAX: "2**31 - 1", INT64_MAX: "2**63 - 1", UINT64_MAX: "2**64 - 1",
               F32_MAX: "3.4028235e+38"}


def found(v):
    """A value as a message shows it: its repr when that is short and says what it is, else its type."""
    if isinstance(v, str):
        return repr(v) if len(v) <= 40 else "a str"
    r = repr(v)
    if len(r) <= 60 and not r.startswith("<"):
        return r
    t = type(v).__qualname__
    return f"{'an' if t[0] in 'aeiouAEIOU' else 'a'} {t}"


def _bound(x):
    if x in _BOUND_TEXT:
        return _BOUND_TEXT[x]
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else repr(float(x))


def _is_bool(v):
    return isinstance(v, bool) or type(v).__name__ == "bool_"  # numpy's bool_ too


def real(name, v, low=None, high=None, *, low_open=False, high_open=False, note="", expected=None):
    """`v` as a float: a finite real number in the bounds ([low, high]; low_open / high_open exclude them).
    `note` follows the expectation in parentheses ("0: greedy"); `expected` replaces its text."""
    ok = isinstance(v, numbers.Real) and not _is_bool(v)
    if ok:
        x = float(v)
        ok = (math.isfinite(x) and (low is None or (x > low if low_open else x >= low)) and
              (high is None or (x < high if high_open else x <= high)))
    if not ok:
        if expected is None:
            if low is not None and high is not None:
                expected = (f"a number in {'(' if low_open else '['}{_bound(low)}, {_bound(high)}"
                            f"{')' if high_open else ']'}")
            elif low is not None:
                expected = f"a finite number {'>' if low_open else '>='} {_bound(low)}"
            elif high is not None:
                expected = f"a finite number {'<' if high_open else '<='} {_bound(high)}"
            else:
                expected = "a finite number"
        raise ValueError(f"{name}: expected {expected}{f' ({note})' if note else ''}, found {found(v)}")
    return x


def integer(name, v, low=None, high=None, *, note="", what="an integer"):
    """`v` as an int: an integer (a Python or numpy one; not a bool, not a float) in [low, high]."""
    i = None
    if not _is_bool(v) and not isinstance(v, float):
        try:
            i = operator.index(v)
        except TypeError:
            pass
    if i is None or (low is not None and i < low) or (high is not None and i > high):
        if low is not None and high is not None:
            expected = f"{what} in [{_bound(low)}, {_bound(high)}]"
        elif low is not None:
            expected = f"{what} >= {_bound(low)}"
        elif high is not None:
            expected = f"{what} <= {_bound(high)}"
        else:
            expected = what
        raise ValueError(f"{name}: expected {expected}{f' ({note})' if note else ''}, found {found(v)}")
    return i


def boolean(name, v):
    """`v` as a bool: True or False (numpy's too), never a truthy string ("false" is not False)."""
    if not _is_bool(v):
        raise ValueError(f"{name}: expected a bool (True or False), found {found(v)}")
    return bool(v)


def string(name, v, choices=None):
    """`v`, a str (one of `choices` when given)."""
    if not isinstance(v, str) or (choices is not None and v not in choices):
        expected = "a str" if choices is None else "one of " + ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name}: expected {expected}, found {found(v)}")
    return v


def path(name, v):
    """`v` as the str path the C++ side takes: a str or an os.PathLike (pathlib.Path)."""
    if isinstance(v, os.PathLike):
        v = os.fspath(v)
    if not isinstance(v, str):
        raise ValueError(f"{name}: expected a str or os.PathLike, found {found(v)}")
    return v


def strings(name, v):
    """`v` as a list of str: a list (or any iterable) of them, not one str."""
    if isinstance(v, (str, bytes)):
        raise ValueError(f"{name}: expected a list of str, found a {type(v).__name__} (wrap it in a list)")
    try:
        items = list(v)
    except TypeError:
        raise ValueError(f"{name}: expected a list of str, found {found(v)}") from None
    for i, s in enumerate(items):
        if not isinstance(s, str):
            raise ValueError(f"{name}[{i}]: expected a str, found {found(s)}")
    return items


def listing(names, most=12):
    """Names for a message that lists what there is: the first `most`, then how many in all."""
    names = list(names)
    shown = ", ".join(names[:most])
    return shown if len(names) <= most else f"{shown}, ... ({len(names)} in all)"
