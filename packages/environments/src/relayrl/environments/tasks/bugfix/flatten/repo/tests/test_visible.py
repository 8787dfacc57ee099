import unittest

from collections_extra.flatten import flatten


class TestFlatten(unittest.TestCase):
    def test_one_level(self):
        self.assertEqual(flatten([1, [2, 3]]), [1, 2, 3])
