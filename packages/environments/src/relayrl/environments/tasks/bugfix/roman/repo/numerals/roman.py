VALUES = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]


def to_roman(number):
    """Roman numeral of 1 <= number <= 3999, with subtractive notation (IV, IX, XL ...)."""
    digits = []
    for value, symbol in VALUES:
        while number >= value:
            digits.append(symbol)
            number -= value
    return "".join(digits)
