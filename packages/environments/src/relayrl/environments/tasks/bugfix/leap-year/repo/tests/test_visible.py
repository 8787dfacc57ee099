import unittest

from calendar_extra.leap import is_leap_year


class TestLeap(unittest.TestCase):
    def test_ordinary(self):
        self.assertTrue(is_leap_year(2024))
