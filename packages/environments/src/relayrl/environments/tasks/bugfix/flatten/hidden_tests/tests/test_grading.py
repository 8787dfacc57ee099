import unittest

from collections_extra.flatten import flatten


class TestFlattenHidden(unittest.TestCase):
    def test_deep(self):
        self.assertEqual(flatten([1, [2, [3, [4, [5]]]], 6]), [1, 2, 3, 4, 5, 6])
    def test_empty(self):
        self.assertEqual(flatten([[], [[]]]), [])
