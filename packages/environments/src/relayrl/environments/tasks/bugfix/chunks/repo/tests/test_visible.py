import unittest

from collections_extra.chunks import chunks


class TestChunks(unittest.TestCase):
    def test_even(self):
        self.assertEqual(chunks([1, 2, 3, 4], 2), [[1, 2], [3, 4]])
