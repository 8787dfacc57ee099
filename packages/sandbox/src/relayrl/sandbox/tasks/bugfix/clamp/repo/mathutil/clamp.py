def clamp(value, low, high):
    """Limit value to the closed interval [low, high]."""
    if value < low:
        return low
    if value < high:
        return high
    return value
