def word_count(text):
    """Number of words in text, words being separated by any whitespace."""
    return len([word for word in text.split(" ") if word])
