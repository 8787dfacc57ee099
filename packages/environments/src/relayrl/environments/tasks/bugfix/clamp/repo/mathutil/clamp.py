def clamp(value, low, high):
    """Limit value to the closed interval [low, high]."""
    return min(low, max(value, high))
