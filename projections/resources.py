"""Arithmetic on resource vectors (dicts of integer base units) and quantity parsing."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from fractions import Fraction

Resources = dict[str, int]

_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")

GPU = "gpu"
K8S_GPU = "nvidia.com/gpu"


def parse_quantity(resource: str, value: object) -> int:
    """A Kubernetes quantity in base units: milli-CPU for `cpu`, bytes for `memory`, whole units otherwise.

    Raises ValueError with a message naming the resource on anything else
    (negative, fractional GPUs, unknown suffix).
    """
    if isinstance(value, bool):
        raise ValueError(f"{resource}: {value!r} is not a quantity")
    text = str(value).strip() if isinstance(value, (int, float, str)) else None
    if text is None:
        raise ValueError(f"{resource}: {value!r} is not a quantity")
    if text.startswith("-"):
        raise ValueError(f"{resource}: {value!r} is negative")
    m = _QUANTITY.match(text)
    if not m:
        raise ValueError(f"{resource}: {value!r} is not a quantity (examples: 8, 500m, 512Mi, 1Ti)")
    number, suffix = m.group(1), m.group(2) or ""
    scale_milli = resource == "cpu"
    # exact arithmetic: a float would turn 10**23 into 99999999999999991611392 without a word
    if suffix == "m":
        milli = Fraction(number)
        amount = milli if scale_milli else milli / 1000
    else:
        amount = Fraction(number) * _SUFFIX[suffix] * (1000 if scale_milli else 1)
    if amount.denominator != 1:
        raise ValueError(f"{resource}: {value!r} is not a whole number of {'milli-CPU' if scale_milli else 'units'}")
    return int(amount)


def parse_resources(values: Mapping[str, object]) -> Resources:
    """Parse a mapping of resource name to quantity; `nvidia.com/gpu` is spelled `gpu`."""
    out: Resources = {}
    for name, value in values.items():
        key = GPU if name == K8S_GPU else str(name)
        out[key] = parse_quantity(key, value)
    return out


def add(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) + v
    return out


def sub(a: Mapping[str, int], b: Mapping[str, int]) -> Resources:
    out = dict(a)
    for k, v in b.items():
        out[k] = out.get(k, 0) - v
    return out


def scale(a: Mapping[str, int], n: int) -> Resources:
    return {k: v * n for k, v in a.items()}


def total(parts: Iterable[Mapping[str, int]]) -> Resources:
    out: Resources = {}
    for p in parts:
        for k, v in p.items():
            out[k] = out.get(k, 0) + v
    return out


def fits(request: Mapping[str, int], free: Mapping[str, int]) -> bool:
    """Whether `request` fits in `free`; a resource `free` does not name is zero there."""
    for k, v in request.items():
        if v > 0 and free.get(k, 0) < v:
            return False
    return True


def positive(a: Mapping[str, int]) -> Resources:
    """Only the strictly positive entries, in sorted key order (stable for output)."""
    return {k: a[k] for k in sorted(a) if a[k] > 0}


def undoing(log: Iterable[tuple[str, Mapping[str, int], int]], keep: Container[str]) -> dict[str, Resources]:
    """Per key, the one change that undoes a log of `(key, amounts, sign)` changes (keys in `keep` left out)."""
    net: dict[str, Resources] = {}
    for key, amounts, sign in log:
        if key in keep:
            continue
        acc = net.setdefault(key, {})
        for r, v in amounts.items():
            acc[r] = acc.get(r, 0) - sign * v
    return {key: delta for key, acc in net.items() if (delta := {r: v for r, v in acc.items() if v})}


def fmt(a: Mapping[str, int]) -> str:
    """A short human form: `gpu=16 cpu=32000m`."""
    parts = []
    for k in sorted(a):
        v = a[k]
        if k == "cpu":
            parts.append(f"cpu={v}m" if v % 1000 else f"cpu={v // 1000}")
        elif k == "memory":
            parts.append(f"memory={_fmt_bytes(v)}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts) if parts else "nothing"


def _fmt_bytes(v: int) -> str:
    for suffix, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if v >= size and v % size == 0:
            return f"{v // size}{suffix}"
    return str(v)


def flavored(resource: str, flavor: str) -> str:
    """The quota key of a resource in a flavor (`gpu@h100`): quota is kept per flavor and resource,
    so a cohort adds up each flavor's quota on its own. Unflavored quota keeps the plain name."""
    return f"{resource}@{flavor}"


def unflavored(resources: Mapping[str, int]) -> Resources:
    """A resource vector with its flavored keys (`gpu@h100`) added up under the plain name (`gpu`)."""
    out: Resources = {}
    for k, v in resources.items():
        plain = k.partition("@")[0]
        out[plain] = out.get(plain, 0) + v
    return out


def gpus_of(resources: Mapping[str, int]) -> int:
    """The GPUs of a resource vector, plain (`gpu`) or per flavor (`gpu@h100`): a queue's nominal quota,
    usage or `borrowed`, whether or not it has flavors."""
    return sum(v for k, v in resources.items() if k == "gpu" or k.startswith("gpu@"))


def gpus_over(usage: Mapping[str, int], nominal: Mapping[str, int]) -> int:
    """GPUs used above nominal quota, flavor by flavor (a flavor's spare quota does not cover another's)."""
    return sum(max(0, usage.get(k, 0) - v) for k, v in nominal.items() if k == "gpu" or k.startswith("gpu@"))
