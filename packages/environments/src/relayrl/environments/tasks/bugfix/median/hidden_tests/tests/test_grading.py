import unittest

from stats.median import median


class TestMedianHidden(unittest.TestCase):
    def test_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)
    def test_single(self):
        self.assertEqual(median([11]), 11)
    def test_even_pair(self):
        self.assertEqual(median([10, 20]), 15)
