import unittest

from units.temperature import celsius_to_fahrenheit


class TestTemperatureHidden(unittest.TestCase):
    def test_points(self):
        self.assertEqual(celsius_to_fahrenheit(100), 212)
        self.assertEqual(celsius_to_fahrenheit(0), 32)
        self.assertEqual(celsius_to_fahrenheit(-40), -40)
