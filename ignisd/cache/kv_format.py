"""KV formats as metadata: element size and storage dtype of each format (DESIGN §4.6). †: imports no torch."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVFormat:
    """One KV storage format.

    name: the wire/config literal (`fp32`, `bf16`).
    elem_bytes: bytes per stored K or V element.
    torch_dtype: the torch dtype name of the stored pages (`float32`, `bfloat16`).
    """

    name: str
    elem_bytes: int
    torch_dtype: str


KV_FORMATS: dict[str, KVFormat] = {
    "fp32": KVFormat("fp32", 4, "float32"),
    "bf16": KVFormat("bf16", 2, "bfloat16"),
}


def get_kv_format(name: str) -> KVFormat:
    """Return the KVFormat called `name`.

    Raises ValueError naming the allowed formats when `name` is unknown (hq-e8-2b arrives with its kernels).
    """
    try:
        return KV_FORMATS[name]
    except KeyError:
        raise ValueError(f"kv_format {name!r} is not supported; allowed: {', '.join(KV_FORMATS)}") from None
