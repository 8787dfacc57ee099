import unittest

from timeutil.duration import parse_duration


class TestDurationHidden(unittest.TestCase):
    def test_minutes(self):
        self.assertEqual(parse_duration("1h30m"), 5400)
        self.assertEqual(parse_duration("2h5m10s"), 7510)
    def test_invalid(self):
        with self.assertRaises(ValueError):
            parse_duration("ten minutes")
