def is_palindrome(text):
    """True when text reads the same backwards, ignoring case and non-alphanumeric characters."""
    kept = [char for char in text if char.isalnum()]
    return kept == kept[::-1]
