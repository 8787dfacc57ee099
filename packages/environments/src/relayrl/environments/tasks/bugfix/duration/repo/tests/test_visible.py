import unittest

from timeutil.duration import parse_duration


class TestDuration(unittest.TestCase):
    def test_seconds(self):
        self.assertEqual(parse_duration("45s"), 45)
