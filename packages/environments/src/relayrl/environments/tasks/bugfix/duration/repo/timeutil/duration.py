import re

UNITS = {"h": 3600, "m": 3600, "s": 1}


def parse_duration(text):
    """Seconds in a duration such as '1h30m', '45s' or '2h5m10s'."""
    parts = re.findall(r"(\d+)([hms])", text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        raise ValueError(f"invalid duration {text!r}")
    return sum(int(number) * UNITS[unit] for number, unit in parts)
