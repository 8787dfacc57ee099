import unittest

from collections_extra.chunks import chunks


class TestChunksHidden(unittest.TestCase):
    def test_remainder(self):
        self.assertEqual(chunks([1, 2, 3, 4, 5], 2), [[1, 2], [3, 4], [5]])
    def test_short(self):
        self.assertEqual(chunks([1, 2], 5), [[1, 2]])
