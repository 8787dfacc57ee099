import unittest

from mathutil.clamp import clamp


class TestClampHidden(unittest.TestCase):
    def test_inside(self):
        self.assertEqual(clamp(7, 0, 10), 7)
    def test_above(self):
        self.assertEqual(clamp(42, 0, 10), 10)
    def test_edges(self):
        self.assertEqual(clamp(10, 0, 10), 10)
        self.assertEqual(clamp(0, 0, 10), 0)
