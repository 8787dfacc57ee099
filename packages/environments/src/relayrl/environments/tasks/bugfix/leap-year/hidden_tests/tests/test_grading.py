import unittest

from calendar_extra.leap import is_leap_year


class TestLeapHidden(unittest.TestCase):
    def test_centuries(self):
        self.assertFalse(is_leap_year(1900))
        self.assertTrue(is_leap_year(2000))
        self.assertFalse(is_leap_year(2100))
    def test_non_leap(self):
        self.assertFalse(is_leap_year(2023))
