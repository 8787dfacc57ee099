import unittest

from units.temperature import celsius_to_fahrenheit


class TestTemperature(unittest.TestCase):
    def test_type(self):
        self.assertIsInstance(celsius_to_fahrenheit(1.5), float)
