def chunks(items, size):
    """Consecutive slices of items of length size; the last one may be shorter."""
    return [items[start:start + size] for start in range(0, len(items) - size + 1, size)]
