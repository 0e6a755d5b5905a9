"""Accelerator names: ftorch's offer table (the clouds' own names) vs SkyPilot's catalog names.

SkyPilot's optimizer silently skips a resources entry whose accelerator name is not in its catalog (an
unknown name passes `sky.Resources` validation), so a wrong name means "no capacity" forever. Where the
names differ, the table maps them; the SkyPilot side comes from SkyPilot 0.14.1's catalog fetchers
(`sky/catalog/data_fetchers/fetch_aws.py` renames AWS g7e's "RTX PRO Server 6000" to `RTXPRO6000`).
Names with characters SkyPilot's catalog names never have are refused at plan time.
"""

from __future__ import annotations

import re

from orchestrator.errors import SpecError

#: ftorch's name -> SkyPilot's catalog name, where they differ
TO_SKY = {"RTX PRO Server 6000": "RTXPRO6000"}
_FROM_SKY = {v.lower(): k for k, v in TO_SKY.items()}
#: SkyPilot catalog accelerator names: letters, digits, '-', '_', '.', no spaces (e.g. A100-80GB, L40S)
_SKY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def sky_name(name: str) -> str:
    """The name SkyPilot's catalog uses for an accelerator of the offer table."""
    return TO_SKY.get(name, name)


def ftorch_name(name: str) -> str:
    """The offer table's name for a name a user wrote (SkyPilot's name accepted too)."""
    return _FROM_SKY.get(name.lower(), name)


def check_sky_name(name: str) -> str:
    """SkyPilot's catalog name for `name`; a SpecError when SkyPilot would never match it."""
    mapped = sky_name(name)
    if not _SKY_NAME.match(mapped):
        raise SpecError(
            "resources.accelerators",
            f"'{name}' is not a SkyPilot catalog accelerator name and ftorch has no mapping for it "
            f"(SkyPilot would skip it silently); known mappings: "
            + ", ".join(f"{k} -> {v}" for k, v in TO_SKY.items()),
        )
    return mapped
