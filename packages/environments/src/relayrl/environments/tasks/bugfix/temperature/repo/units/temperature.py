def celsius_to_fahrenheit(celsius):
    """Degrees Fahrenheit of a temperature in degrees Celsius."""
    return (celsius + 32) * 9 / 5
