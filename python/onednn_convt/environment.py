"""On/off switches read from the environment at import (``ONEDNN_CONVT_AUTOTUNE``,
``ONEDNN_CONVT_GUARDS``): one spelling of on and off for all of them, and a warning for any
other value, so that a typo does not silently keep the default."""

from __future__ import annotations

import os
import warnings

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")


def switch(name: str, default: bool) -> bool:
    """The switch ``name``: on for 1/true/yes/on, off for 0/false/no/off (any case, spaces
    around ignored), ``default`` when unset or empty; any other value warns (a
    RuntimeWarning naming the variable) and gives ``default``."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in ON:
        return True
    if value in OFF:
        return False
    if value:
        msg = (f"{name}={raw!r}: expected one of {', '.join(ON)} (on) or {', '.join(OFF)} (off); "
               f"using the default ({'on' if default else 'off'})")
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
    return default
