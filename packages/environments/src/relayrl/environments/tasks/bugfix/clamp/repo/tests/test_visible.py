import unittest

from mathutil.clamp import clamp


class TestClamp(unittest.TestCase):
    def test_below(self):
        self.assertEqual(clamp(-5, 0, 10), 0)
