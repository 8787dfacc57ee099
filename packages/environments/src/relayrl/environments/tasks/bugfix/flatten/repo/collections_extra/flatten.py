def flatten(nested):
    """All non-list items of an arbitrarily nested list, in order."""
    flat = []
    for item in nested:
        if isinstance(item, list):
            flat.extend(item)
        else:
            flat.append(item)
    return flat
