"""A small shop backend used by the code-search questions."""
