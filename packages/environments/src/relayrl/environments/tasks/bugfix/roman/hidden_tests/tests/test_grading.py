import unittest

from numerals.roman import to_roman


class TestRomanHidden(unittest.TestCase):
    def test_subtractive(self):
        self.assertEqual(to_roman(1994), "MCMXCIV")
        self.assertEqual(to_roman(44), "XLIV")
    def test_additive(self):
        self.assertEqual(to_roman(2023), "MMXXIII")
