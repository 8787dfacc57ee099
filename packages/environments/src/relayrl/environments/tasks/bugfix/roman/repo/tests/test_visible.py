import unittest

from numerals.roman import to_roman


class TestRoman(unittest.TestCase):
    def test_simple(self):
        self.assertEqual(to_roman(3), "III")
